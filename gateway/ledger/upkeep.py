"""The ledger's periodic work, each loop run by `LedgerRunner`: what other replicas and operators wrote to
the store (salts, resets), the policies in force, the retention sweep and compaction."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol, runtime_checkable

from gateway.ledger.config import compaction_horizon
from gateway.ledger.context import LedgerContext
from gateway.ledger.ingest import ClockOffsets
from gateway.ledger.lifecycle import LedgerState
from gateway.ledger.records import SourceEvent, SourceEventKind, TenantPolicyRecord
from gateway.ledger.runner import LedgerRunner
from gateway.ledger.salt_keeper import SaltKeeper
from gateway.ledger.writer import error_kind
from gateway.log import get_logger
from gateway.policy.loader import PolicySet

log = get_logger(__name__)


@runtime_checkable
class CompactingStore(Protocol):
    async def compact(self, before: float) -> int: ...


def resets_in(events: list[SourceEvent]) -> set[tuple[str, float]]:
    """The operator resets among a store's source events, as (source, boundary)."""
    return {(event.source, event.boundary_ts) for event in events if event.kind == SourceEventKind.RESET}


def retention_by_tenant(policies: PolicySet) -> dict[str, float]:
    return {name: tenant.offload.retention_seconds for name, tenant in policies.tenants.items()
            if tenant.offload.retention_seconds is not None}


class LedgerUpkeep:
    def __init__(self, context: LedgerContext, state: LedgerState, salts: SaltKeeper, clocks: ClockOffsets) -> None:
        self.store = context.store
        self.state = state
        self.salts = salts
        self.clocks = clocks
        self.config = context.config
        self.holder = context.holder
        self.metrics = context.metrics
        self.resets_seen: set[tuple[str, float]] = set()  # loaded from the store at start
        self._policies_remembered: str | None = None

    def start(self, runner: LedgerRunner) -> None:
        runner.keep_running("ledger-salts", self._salt_refresh_loop)
        runner.keep_running("ledger-retention-sweep", self._sweep_loop)
        runner.keep_running("ledger-compaction", self._compaction_loop)

    async def _salt_refresh_loop(self) -> None:
        """User salts issued by other replicas, and operator resets, reach this one through the store."""
        while True:
            await asyncio.sleep(self.config.salt_refresh_s)
            try:
                await self.salts.refresh(self.store)
                await self._pick_up_resets()
                await self._remember_policies()
            except Exception as error:  # the store is away or failing: try again next round
                self.metrics.store_error(error_kind(error))

    async def _pick_up_resets(self) -> None:
        """`kvgate ledger reset-source` closes records in the store; reload that source's open blocks."""
        new = resets_in(await self.store.source_events()) - self.resets_seen
        if not new:
            return
        rows = await self.store.open_blocks()
        for source in {source for source, _ts in new}:
            self.state.replace_source(source, [row for row in rows if row.source == source])
        self.resets_seen |= new

    async def _remember_policies(self) -> None:
        """Keep the last policy that named each tenant, so a tenant removed later is still judged."""
        policies = self.holder.current
        if self._policies_remembered == policies.version:
            return
        now = time.time()
        await self.store.remember_policies([
            TenantPolicyRecord(name, tenant.offload.retention_seconds, tuple(tenant.offload.allowed_media),
                               policies.version, now) for name, tenant in policies.tenants.items()])
        self._policies_remembered = policies.version

    async def _compaction_loop(self) -> None:
        """Closed records past the horizon leave the store; the audit's totals (kept by the store) keep them."""
        if not isinstance(self.store, CompactingStore):
            log.info("ledger_compaction_unavailable", store=type(self.store).__name__)
            await asyncio.Event().wait()  # nothing to do for this store, ever
            return
        store: CompactingStore = self.store
        while True:
            await asyncio.sleep(self.config.compact_interval_s)
            horizon = compaction_horizon(self.config.compact_after_s,
                                         list(retention_by_tenant(self.holder.current).values()))
            try:
                deleted = await store.compact(time.time() - horizon)
            except Exception as error:  # retried next interval
                self.metrics.store_error(type(error).__name__)
                continue
            if deleted:
                log.info("ledger_compacted", records=deleted, horizon_s=horizon)

    async def _sweep_loop(self) -> None:
        """Resident blocks past their tenant's retention are counted (once each); clock estimates are saved."""
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            policies = self.holder.current
            offsets = self.clocks.offsets
            for found in self.state.flag_overdue(time.time(), retention_by_tenant(policies), offsets):
                self.metrics.overdue(found, policies)
                await asyncio.sleep(0)  # let requests through between chunks
            if offsets:
                try:
                    await self.store.record_clock(self.clocks.snapshot(), time.time())
                except Exception as error:  # reported next round; the estimate stays in memory
                    self.metrics.store_error(type(error).__name__)
