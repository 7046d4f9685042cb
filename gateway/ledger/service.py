"""The ledger inside a gateway process: one subscriber task per configured KV-event source, the state
machine, the batched store writer, metrics, and the audit.

Data flows one way: subscriber -> `LedgerState` (pure) -> `BatchWriter` -> store; the metrics follow the
batches the store accepted. Nothing here runs on the request path except `remember_user_salt`, which only
touches memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from datetime import datetime
from typing import Any

import zmq.asyncio

from gateway.kvevents.endpoints import SourceSpec, plan_sources
from gateway.kvevents.sequence import Cursor
from gateway.kvevents.subscriber import Subscriber
from gateway.kvevents.wire import EventBatch
from gateway.ledger.attribution import KnownHashes
from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore, StoreUnavailable
from gateway.ledger.config import LedgerSettings
from gateway.ledger.factory import open_store
from gateway.ledger.lifecycle import LedgerState, SourceEnd
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.records import BatchOps, GapRecord
from gateway.ledger.salts import DigestLru, SaltIndex, tenant_salt_entry, user_salt_entry
from gateway.ledger.writer import BatchWriter
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.reloader import PolicyHolder
from gateway.settings import Settings
from gateway.tasks import TaskSupervisor

log = get_logger(__name__)
RESUBSCRIBE_DELAY_S = 1.0


class LedgerService:
    def __init__(
        self, store: LedgerStore, config: LedgerSettings, metrics: GatewayMetrics, holder: PolicyHolder,
        tasks: TaskSupervisor, secret: bytes | None,
    ) -> None:
        self.store = store
        self.config = config
        self.holder = holder
        self.secret = secret
        self.metrics = LedgerMetrics(metrics)
        self.salts = SaltIndex.build(holder.current, secret, DigestLru(config.user_salts))
        self.state = LedgerState(self.salts, KnownHashes(config.known_hashes))
        self.writer = BatchWriter(store, config.spool_events, self._applied, self._dropped)
        self._tasks = tasks
        self._own: list[asyncio.Task[Any]] = []
        self._subscribers: dict[str, tuple[SourceSpec, asyncio.Task[Any]]] = {}
        self._cursors: dict[str, Cursor] = {}
        # Requests already remembered, keyed by a 16-byte digest of (tenant, epoch, user), never the user itself:
        # repeat calls are one dict lookup, and memory per entry is fixed whatever the `user` length.
        self._remembered: OrderedDict[bytes, None] = OrderedDict()
        self._salt_position = 0
        self._zmq = zmq.asyncio.Context()

    @classmethod
    async def open(
        cls, settings: Settings, metrics: GatewayMetrics, holder: PolicyHolder, tasks: TaskSupervisor,
        config: LedgerSettings | None = None,
    ) -> LedgerService:
        config = config or LedgerSettings()
        store = await open_store(settings, config.redis_prefix)
        secret = settings.salt_secret.get_secret_value().encode() if settings.salt_secret else None
        if secret is None:
            log.warning("ledger_without_salt_secret", effect="every block is reported unattributed")
        service = cls(store, config, metrics, holder, tasks, secret)
        await service._resume()
        service._start()
        return service

    async def _resume(self) -> None:
        """Pick up where the store left off: remembered user salts, resident blocks, per-source cursors."""
        try:
            await self._refresh_salts()
            self.state.load(await self.store.open_blocks())
            self._cursors = await self.store.cursors()
        except StoreUnavailable as error:
            log.warning("ledger_resume_without_store", error=str(error))
        self.metrics.resident(self.state.resident_counts, self.holder.current)

    def _start(self) -> None:
        self._own.append(self._tasks.spawn(self.writer.run(self.config.flush_interval_s), "ledger-writer"))
        self._own.append(self._tasks.spawn(self._salt_refresh_loop(), "ledger-salts"))
        self._own.append(self._tasks.spawn(self._sweep_loop(), "ledger-retention-sweep"))
        self._plan(self.holder.current)
        self._remember_tenant_epochs(self.holder.current)
        self.holder.listeners.append(self._on_policies)

    async def close(self) -> None:
        if self._on_policies in self.holder.listeners:
            self.holder.listeners.remove(self._on_policies)
        tasks = self._own + [task for _spec, task in self._subscribers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._subscribers.clear()
        if not await self.writer.flush():
            log.warning("ledger_closed_with_unwritten_batches", ops=self.writer.pending_ops)
        await self.store.close()
        self._zmq.term()

    # -- request path ----------------------------------------------------------------------------

    def remember_user_salt(self, tenant: str, epoch: int, user: str) -> None:
        """Called per request for `isolation: user`; memory only, repeat calls are a dict lookup."""
        if self.secret is None:
            return
        key = hashlib.blake2b(f"{tenant}\0{epoch}\0{user}".encode(), digest_size=16).digest()
        if key in self._remembered:
            self._remembered.move_to_end(key)
            return
        self._remembered[key] = None
        if len(self._remembered) > self.config.user_salts:
            self._remembered.popitem(last=False)
        entry = user_salt_entry(self.secret, tenant, epoch, user)
        self.salts.add_users([entry])
        self.writer.add_salts([entry])
        self.metrics.user_salts(self.salts.remembered)

    def _remember_tenant_epochs(self, policies: PolicySet) -> None:
        """Every epoch in force is recorded (as a digest) so late events under it are still attributed, here
        and after a restart, without ever deriving the epochs in between."""
        if self.secret is None:
            return
        entries = [tenant_salt_entry(self.secret, name, tenant.cache.salt_epoch)
                   for name, tenant in policies.tenants.items()]
        self.salts.add_users(entries)
        self.writer.add_salts(entries)
        self.metrics.user_salts(self.salts.remembered)

    # -- audit -----------------------------------------------------------------------------------

    async def audit(self, policies: PolicySet, tenant: str | None, since: datetime | None) -> dict[str, Any]:
        await self.writer.flush()  # everything received so far is in the report
        return await collect_audit(self.store, policies, tenant, since)

    # -- BatchSink: called by subscribers, in sequence order per source ---------------------------

    async def deliver(self, source: str, seq: int, batch: EventBatch) -> None:
        await self.writer.submit(self.state.apply(source, seq, batch, self.holder.current.version))

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None:
        self.writer.add_gap(GapRecord(source, first, last, after_ts))
        self.metrics.missing(source, last - first + 1)

    async def restarted(self, source: str, boundary_ts: float) -> None:
        await self._end_source(source, SourceEnd("restart", boundary_ts, boundary_ts, time.time()))

    async def lost(self, source: str, boundary_ts: float) -> None:
        await self._end_source(source, SourceEnd("lost", boundary_ts, None, time.time()))

    async def _end_source(self, source: str, end: SourceEnd) -> None:
        await self.writer.submit(self.state.close_source(source, end, self.holder.current.version))

    # -- writer callbacks ------------------------------------------------------------------------

    def _applied(self, batch: BatchOps) -> None:
        self.metrics.applied(batch, self.holder.current)
        self.metrics.resident(self.state.resident_counts, self.holder.current)

    def _dropped(self, batch: BatchOps) -> None:
        log.warning("ledger_spool_full", source=batch.source, seq=batch.seq, ops=batch.size)
        self.metrics.missing(batch.source, 1)

    # -- policies and subscribers ------------------------------------------------------------------

    def _on_policies(self, policies: PolicySet) -> None:
        self.salts = SaltIndex.build(policies, self.secret, self.salts.remembered)
        self.state.salts = self.salts
        self._remember_tenant_epochs(policies)
        self._plan(policies)

    def _plan(self, policies: PolicySet) -> None:
        wanted = {spec.name: spec for spec in plan_sources(policies.gateway)}
        for name, (spec, task) in list(self._subscribers.items()):
            if wanted.get(name) != spec:
                task.cancel()
                del self._subscribers[name]
        for name, spec in wanted.items():
            if name not in self._subscribers:
                self._subscribers[name] = (spec, self._tasks.spawn(self._subscribe(spec), f"kv-events:{name}"))

    async def _subscribe(self, spec: SourceSpec) -> None:
        """Keep one subscriber running for the source; a crash resumes from the last batch handled."""
        while True:
            subscriber = Subscriber(spec, self, self._cursors.get(spec.name), self.config.timing(), self._zmq)
            try:
                await subscriber.run()
            except (zmq.ZMQError, OSError) as error:
                log.error("kv_events_subscriber_failed", source=spec.name, error=str(error))
            finally:
                if subscriber.tracker.cursor is not None:
                    self._cursors[spec.name] = subscriber.tracker.cursor
            await asyncio.sleep(RESUBSCRIBE_DELAY_S)

    # -- periodic work -----------------------------------------------------------------------------

    async def _salt_refresh_loop(self) -> None:
        """User salts issued by other replicas reach this one through the store."""
        while True:
            await asyncio.sleep(self.config.salt_refresh_s)
            try:
                await self._refresh_salts()
            except StoreUnavailable:
                continue

    async def _refresh_salts(self) -> None:
        entries, self._salt_position = await self.store.salt_entries(self._salt_position)
        if entries:
            self.salts.add_users(entries)
            self.metrics.user_salts(self.salts.remembered)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            policies = self.holder.current
            retention = {name: tenant.offload.retention_seconds for name, tenant in policies.tenants.items()
                         if tenant.offload.retention_seconds is not None}
            for found in self.state.flag_overdue(time.time(), retention):
                self.metrics.overdue(found, policies)
                await asyncio.sleep(0)  # let requests through between chunks
