"""Read what the audit needs from a store and build the report; shared by `/admin/audit` and `kvgate audit`."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

from gateway.ledger.base import LedgerStore
from gateway.ledger.report import AuditInputs, Window, build_report
from gateway.policy.loader import PolicySet


async def collect_audit(
    store: LedgerStore, policies: PolicySet, tenant: str | None, since: datetime | None,
    clock_offsets: dict[str, float] | None = None,
) -> dict[str, Any]:
    """`clock_offsets`: a running gateway's own estimates (fresher than the store's)."""
    since_ts = since.timestamp() if since is not None else None
    inputs = AuditInputs(
        records=await store.records(since_ts, tenant),
        missing_batches=await store.missing_batches(),
        source_events=await store.source_events(),
        clock_offsets=(await store.clock_offsets()) | (clock_offsets or {}),
        last_policies=await store.tenant_policies(),
    )
    # Built on a worker thread: a large ledger must not stall the gateway's event loop.
    return await asyncio.to_thread(build_report, inputs, policies, Window(now=time.time(), since=since_ts), tenant)
