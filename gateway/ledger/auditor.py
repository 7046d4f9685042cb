"""The audit of a running gateway (`/admin/audit`): everything received so far, read back from the store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from gateway.errors import ServiceUnavailable
from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore
from gateway.ledger.ingest import ClockOffsets
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.writer import BatchWriter, error_kind
from gateway.policy.loader import PolicySet


class LedgerUnavailable(ServiceUnavailable):
    pass


class LedgerAuditor:
    def __init__(self, store: LedgerStore, writer: BatchWriter, clocks: ClockOffsets, metrics: LedgerMetrics) -> None:
        self.store = store
        self.writer = writer
        self.clocks = clocks
        self.metrics = metrics

    async def audit(self, policies: PolicySet, tenant: str | None, since: datetime | None) -> dict[str, Any]:
        await self.writer.flush()  # everything received so far is in the report (kept if the store fails)
        try:
            return await collect_audit(self.store, policies, tenant, since, self.clocks.snapshot())
        except Exception as error:  # the store cannot be read now: a 503 in the OpenAI shape, counted
            kind = error_kind(error)
            self.metrics.store_error(kind)
            raise LedgerUnavailable(f"the ledger store cannot be read now ({kind}); try again") from error
