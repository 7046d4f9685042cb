"""Read what the audit needs from a store and build the report; shared by `/admin/audit` and `kvgate audit`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from gateway.ledger.base import LedgerStore
from gateway.ledger.records import LedgerSummary, TenantPolicyRecord
from gateway.ledger.report import AuditInputs, Window, build_report, build_summary_report
from gateway.policy.loader import PolicySet


async def collect_audit(
    store: LedgerStore, policies: PolicySet, tenant: str | None, since: datetime | None,
    clock_offsets: dict[str, float] | None = None, now: float | None = None,
) -> dict[str, Any]:
    """`clock_offsets`: a running gateway's own estimates (fresher than the store's); `now`: the gateway's
    time the report is judged at (the current time unless given)."""
    if since is None and isinstance(store, OneReadStore):
        return await store.summary_report(policies, tenant, clock_offsets or {}, time.time() if now is None else now)
    since_ts = since.timestamp() if since is not None else None
    offsets = (await store.clock_offsets()) | (clock_offsets or {})
    last_policies = await store.tenant_policies()
    read = await store.windowed_read(since_ts, tenant)
    inputs = AuditInputs(read.records, read.missing_batches, read.source_events, offsets, last_policies,
                         read.changes_in_progress, read.writes_during_read)
    window = Window(now=time.time() if now is None else now, since=since_ts)
    # Built on a worker thread: a large ledger must not stall the gateway's event loop.
    return await asyncio.to_thread(build_report, inputs, policies, window, tenant)


@runtime_checkable
class OneReadStore(Protocol):
    """A store that serves an unwindowed report from its own totals (no scan of the records), read in one
    consistent read (SQLite: one snapshot on its reader thread; Redis: one script call), so the report never
    shows half of an apply, and a busy event loop adds its delay once, not per read."""

    async def summary_report(
        self, policies: PolicySet, tenant: str | None, clock_offsets: dict[str, float], now: float,
    ) -> dict[str, Any]: ...


def summary_report_from(
    summary_of: Callable[[dict[str, float], dict[str, float]], LedgerSummary], inputs: AuditInputs,
    policies: PolicySet, tenant: str | None, now: float,
) -> dict[str, Any]:
    """The unwindowed report from inputs already read (`inputs.clock_offsets` merged with the gateway's) and
    `summary_of(limits, offsets)`, the store's aggregates for those retention limits and offsets."""
    limits = retention_limits(policies, inputs.last_policies)
    summary = summary_of(limits, inputs.clock_offsets)
    return build_summary_report(summary, inputs, policies, Window(now=now, since=None), tenant)


def retention_limits(policies: PolicySet, last: dict[str, TenantPolicyRecord]) -> dict[str, float]:
    limits = {name: record.retention_s for name, record in last.items()
              if name not in policies.tenants and record.retention_s is not None}
    limits.update({name: tenant.offload.retention_seconds for name, tenant in policies.tenants.items()
                   if tenant.offload.retention_seconds is not None})
    return limits
