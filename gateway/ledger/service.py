"""The ledger inside a gateway process, composed of its parts:

* `LedgerIngest` (ingest.py) receives what the subscribers of `SourceSubscriptions` (subscriptions.py)
  decode, turns it into store operations through the pure `LedgerState` and queues them on the `BatchWriter`;
* `SaltKeeper` (salt_keeper.py) holds the salts blocks are attributed by;
* `LedgerUpkeep` (upkeep.py) runs the periodic loops, and `LedgerRunner` (runner.py) keeps every ledger task
  alive; `LedgerAuditor` (auditor.py) answers `/admin/audit`.

Nothing here runs on the request path except `remember_user_salt`, which only touches memory.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gateway.ledger.attribution import KnownHashes
from gateway.ledger.auditor import LedgerAuditor
from gateway.ledger.base import LedgerStore
from gateway.ledger.config import LedgerSettings
from gateway.ledger.context import LedgerContext
from gateway.ledger.factory import open_store
from gateway.ledger.ingest import ClockOffsets, LedgerIngest, WriterReports
from gateway.ledger.lifecycle import LedgerState
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.runner import LedgerRunner
from gateway.ledger.salt_keeper import SaltKeeper
from gateway.ledger.salts import DigestLru, SaltIndex
from gateway.ledger.subscriptions import SourceSubscriptions
from gateway.ledger.upkeep import LedgerUpkeep, resets_in
from gateway.ledger.writer import BatchWriter
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.reloader import PolicyHolder
from gateway.settings import Settings
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor

log = get_logger(__name__)
CLOSE_FLUSH_S = 15.0  # the last flush at shutdown, and closing the store, each wait at most this long


@dataclass(frozen=True)
class LedgerWiring:
    """How this process's ledger is connected: the shared store connections, and whether it ingests events."""

    storage: Storage | None = None
    ingest: bool = True


class LedgerService:
    def __init__(
        self, store: LedgerStore, config: LedgerSettings, metrics: GatewayMetrics, holder: PolicyHolder,
        tasks: TaskSupervisor, secret: bytes | None,
    ) -> None:
        self.context = LedgerContext(store, config, holder, LedgerMetrics(metrics))
        index = SaltIndex.build(holder.current, secret, DigestLru(config.user_salts))
        self.state = LedgerState(index, KnownHashes(config.known_hashes))
        reports = WriterReports(self.state, holder, self.context.metrics)
        self.writer = BatchWriter(store, config.spool_events, reports.applied, reports.dropped,
                                  self.context.metrics.store_error)
        self.salts = SaltKeeper(index, secret, self.writer, self.context.metrics)
        self.clocks = ClockOffsets()
        self.ingest = LedgerIngest(self.state, self.writer, holder, self.context.metrics, self.clocks)
        self.subscriptions = SourceSubscriptions(self.ingest, self.state, config.timing(), tasks,
                                                 self.context.metrics)
        self.upkeep = LedgerUpkeep(self.context, self.state, self.salts, self.clocks)
        self.auditor = LedgerAuditor(store, self.writer, self.clocks, self.context.metrics)
        self.runner = LedgerRunner(tasks, self.context.metrics)

    @classmethod
    async def open(
        cls, settings: Settings, metrics: GatewayMetrics, holder: PolicyHolder, tasks: TaskSupervisor,
        config: LedgerSettings | None = None, wiring: LedgerWiring = LedgerWiring(),
    ) -> LedgerService:
        """`wiring.storage`: the process's shared store connections (a Redis ledger runs on its pool). With
        `wiring.ingest` False (the workers of `serve --workers N` other than the first) the service subscribes
        to no KV-event source and runs no periodic pass: it only records the user salts its requests issue."""
        config = config or LedgerSettings()
        store = await open_store(settings, config.redis_prefix, config.sqlite_busy_timeout_ms, wiring.storage)
        secret = settings.salt_secret.get_secret_value().encode() if settings.salt_secret else None
        if secret is None:
            log.warning("ledger_without_salt_secret", effect="every block is reported unattributed")
        service = cls(store, config, metrics, holder, tasks, secret)
        if not wiring.ingest:
            service._start_recording_salts()
            return service
        await service._resume()
        service._start()
        return service

    async def _resume(self) -> None:
        """Pick up where the store left off: remembered user salts, resident blocks, per-source cursors."""
        store = self.context.store
        try:
            await self.salts.refresh(store)
            self.state.load(await store.open_blocks())
            self.subscriptions.cursors = await store.cursors()
            self.clocks.offsets = await store.clock_offsets()
            self.upkeep.resets_seen = resets_in(await store.source_events())
        except Exception as error:  # start anyway; the writer spools until the store is back
            log.warning("ledger_resume_without_store", error=repr(error)[:300])
        self.context.metrics.resident(self.state.resident_counts, self.context.holder.current)

    def _start(self) -> None:
        flush_interval_s = self.context.config.flush_interval_s
        self.runner.keep_running("ledger-writer", lambda: self.writer.run(flush_interval_s))
        self.upkeep.start(self.runner)
        self.subscriptions.plan(self.context.holder.current)
        self.salts.remember_tenant_epochs(self.context.holder.current)
        self.context.holder.listeners.append(self._on_policies)

    def _start_recording_salts(self) -> None:
        flush_interval_s = self.context.config.flush_interval_s
        self.runner.keep_running("ledger-writer", lambda: self.writer.run(flush_interval_s))
        self.salts.remember_tenant_epochs(self.context.holder.current)
        self.context.holder.listeners.append(self._on_salt_policies)

    def _on_salt_policies(self, policies: PolicySet) -> None:
        self.state.salts = self.salts.rebuild(policies)

    def _on_policies(self, policies: PolicySet) -> None:
        self.state.salts = self.salts.rebuild(policies)
        self.subscriptions.plan(policies)

    def remember_user_salt(self, tenant: str, epoch: int, user: str) -> None:
        """The request feature's hook (`isolation: user`); memory only."""
        self.salts.remember_user_salt(tenant, epoch, user)

    async def audit(self, policies: PolicySet, tenant: str | None, since: datetime | None) -> dict[str, Any]:
        return await self.auditor.audit(policies, tenant, since)

    async def close(self) -> None:
        listeners = self.context.holder.listeners
        for listener in (self._on_policies, self._on_salt_policies):
            if listener in listeners:
                listeners.remove(listener)
        await asyncio.gather(self.runner.stop(), self.subscriptions.stop())
        # A store that hangs (a write stuck behind a dead connection) must not hold shutdown forever: what is
        # not written by then is logged, as any unwritten batch is.
        written = False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_FLUSH_S):
                written = await self.writer.flush()
        if not written:
            log.warning("ledger_closed_with_unwritten_batches", ops=self.writer.pending_ops)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_FLUSH_S):
                await self.context.store.close()
        self.subscriptions.close()
