"""The ledger inside a gateway process: one subscriber task per configured KV-event source, the state
machine, the batched store writer, metrics, and the audit.

Data flows one way: subscriber -> `LedgerState` (pure) -> `BatchWriter` -> store; the metrics follow the
batches the store accepted. Nothing here runs on the request path except `remember_user_salt`, which only
touches memory. Every long-running ledger task runs under `_keep_running`: if it ever ends (an error nobody
foresaw), it is logged, counted and started again after a pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import zmq.asyncio

from gateway.errors import GatewayError
from gateway.kvevents.endpoints import SourceSpec, plan_sources
from gateway.kvevents.sequence import Cursor
from gateway.kvevents.subscriber import Subscriber
from gateway.kvevents.wire import EventBatch
from gateway.ledger.attribution import KnownHashes
from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore, StoreUnavailable
from gateway.ledger.config import LedgerSettings, compaction_horizon
from gateway.ledger.factory import open_store
from gateway.ledger.lifecycle import LedgerState, SourceEnd
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.records import (
    PRESUMED_RESTART,
    RESTART,
    BatchOps,
    GapRecord,
    SaltDigestEntry,
    TenantPolicyRecord,
)
from gateway.ledger.salts import DigestLru, SaltIndex, tenant_salt_entry, user_salt_entry
from gateway.ledger.writer import BatchWriter
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.reloader import PolicyHolder
from gateway.settings import Settings
from gateway.tasks import TaskSupervisor, cancel_and_wait

log = get_logger(__name__)
RESUBSCRIBE_DELAY_S = 1.0
RESTART_DELAY_S = 1.0  # before a ledger task that ended is started again
CLOCK_SAMPLES = 256  # receive-time samples per source for the clock-offset estimate


CLOSE_FLUSH_S = 15.0  # the last flush at shutdown, and closing the store, each wait at most this long


class LedgerUnavailable(GatewayError):
    status_code = 503
    error_type = "service_unavailable"


@runtime_checkable
class CompactingStore(Protocol):
    async def compact(self, before: float) -> int: ...


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
        self.writer = BatchWriter(store, config.spool_events, self._applied, self._dropped, self.metrics.store_error)
        self._tasks = tasks
        self._own: list[asyncio.Task[Any]] = []
        self._subscribers: dict[str, tuple[SourceSpec, asyncio.Task[Any]]] = {}
        self._cursors: dict[str, Cursor] = {}
        # Requests already remembered, keyed by a 16-byte digest of (tenant, epoch, user), never the user itself:
        # repeat calls are one dict lookup, and memory per entry is fixed whatever the `user` length.
        self._remembered: OrderedDict[bytes, None] = OrderedDict()
        self._salt_position = 0
        self._clock_samples: dict[str, deque[float]] = {}
        self.clock_offsets: dict[str, float] = {}  # source -> gateway time - publisher time (estimate)
        self._resets_seen: set[tuple[str, float]] = set()
        self._policies_remembered: str | None = None
        self._zmq = zmq.asyncio.Context()

    @classmethod
    async def open(
        cls, settings: Settings, metrics: GatewayMetrics, holder: PolicyHolder, tasks: TaskSupervisor,
        config: LedgerSettings | None = None, ingest: bool = True,
    ) -> LedgerService:
        """With `ingest` False (the workers of `serve --workers N` other than the first) the service subscribes
        to no KV-event source and runs no periodic pass: it only records the user salts its requests issue."""
        config = config or LedgerSettings()
        store = await open_store(settings, config.redis_prefix, config.sqlite_busy_timeout_ms)
        secret = settings.salt_secret.get_secret_value().encode() if settings.salt_secret else None
        if secret is None:
            log.warning("ledger_without_salt_secret", effect="every block is reported unattributed")
        service = cls(store, config, metrics, holder, tasks, secret)
        if not ingest:
            service._start_recording_salts()
            return service
        await service._resume()
        service._start()
        return service

    async def _resume(self) -> None:
        """Pick up where the store left off: remembered user salts, resident blocks, per-source cursors."""
        try:
            await self._refresh_salts()
            self.state.load(await self.store.open_blocks())
            self._cursors = await self.store.cursors()
            self.clock_offsets = await self.store.clock_offsets()
            events = await self.store.source_events()
            self._resets_seen = {(event.source, event.boundary_ts) for event in events if event.kind == "reset"}
        except Exception as error:  # start anyway; the writer spools until the store is back
            log.warning("ledger_resume_without_store", error=repr(error)[:300])
        self.metrics.resident(self.state.resident_counts, self.holder.current)

    def _start(self) -> None:
        self._own.append(self._keep_running("ledger-writer", lambda: self.writer.run(self.config.flush_interval_s)))
        self._own.append(self._keep_running("ledger-salts", self._salt_refresh_loop))
        self._own.append(self._keep_running("ledger-retention-sweep", self._sweep_loop))
        self._own.append(self._keep_running("ledger-compaction", self._compaction_loop))
        self._plan(self.holder.current)
        self._remember_tenant_epochs(self.holder.current)
        self.holder.listeners.append(self._on_policies)

    def _start_recording_salts(self) -> None:
        self._own.append(self._keep_running("ledger-writer", lambda: self.writer.run(self.config.flush_interval_s)))
        self._remember_tenant_epochs(self.holder.current)
        self.holder.listeners.append(self._on_salt_policies)

    def _on_salt_policies(self, policies: PolicySet) -> None:
        self.salts = SaltIndex.build(policies, self.secret, self.salts.remembered)
        self._remember_tenant_epochs(policies)

    async def close(self) -> None:
        if self._on_salt_policies in self.holder.listeners:
            self.holder.listeners.remove(self._on_salt_policies)
        if self._on_policies in self.holder.listeners:
            self.holder.listeners.remove(self._on_policies)
        await cancel_and_wait(self._own + [task for _spec, task in self._subscribers.values()])
        self._subscribers.clear()
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
                await self.store.close()
        self._zmq.term()

    def _keep_running(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> asyncio.Task[Any]:
        return self._tasks.spawn(self._supervised(name, work), name)

    async def _supervised(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run `work` for as long as the service lives; whatever ends it, it is counted and started again."""
        while True:
            try:
                await work()
                log.error("ledger_task_ended", task=name)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a ledger task must never stay dead: logged, counted, restarted
                log.error("ledger_task_failed", task=name, error=repr(error)[:300])
            self.metrics.task_restarted(name)
            await asyncio.sleep(RESTART_DELAY_S)

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
        self.issued(entry)

    def issued(self, entry: SaltDigestEntry) -> None:
        """A salt digest this process has just issued (before its request goes upstream); nothing more here.
        Under `serve --workers N` the non-ingesting workers pass it to the ingesting one
        (gateway/http/workers.py)."""

    def learn_salts(self, entries: list[SaltDigestEntry]) -> None:
        """Salt digests issued by a sibling worker, attributed from now on."""
        if entries:
            self.salts.add_users(entries)
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
        await self.writer.flush()  # everything received so far is in the report (kept if the store fails)
        try:
            return await collect_audit(self.store, policies, tenant, since, dict(self.clock_offsets))
        except Exception as error:  # the store cannot be read now: a 503 in the OpenAI shape, counted
            kind = "unavailable" if isinstance(error, StoreUnavailable) else type(error).__name__
            self.metrics.store_error(kind)
            raise LedgerUnavailable(f"the ledger store cannot be read now ({kind}); try again") from error

    # -- BatchSink: called by subscribers, in sequence order per source ---------------------------

    async def deliver(self, source: str, seq: int, batch: EventBatch, received_at: float | None = None) -> None:
        if received_at is not None:
            self._clock_sample(source, received_at - batch.ts)
        await self.writer.submit(self.state.apply(source, seq, batch, self.holder.current.version))

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None:
        self.writer.add_gap(GapRecord(source, first, last, after_ts))
        self.metrics.missing(source, last - first + 1)

    async def restarted(self, source: str, boundary_ts: float, previous: Cursor, proven: bool = True) -> None:
        """Every block stored up to the old process's last batch closes as `restart` (or `restart_presumed`
        when the cursor's batch was only gone from replay: that proves no removal, and the report says so)."""
        stored_before = math.nextafter(previous.ts, math.inf)
        end = SourceEnd(RESTART if proven else PRESUMED_RESTART, boundary_ts, stored_before, time.time())
        await self.writer.submit(self.state.close_source(source, end, self.holder.current.version))

    async def silent(self, source: str, since: float) -> None:
        batch = self.state.silence(source, since, self.holder.current.version)
        if batch is not None:
            await self.writer.submit(batch)

    async def resumed(self, source: str) -> None:
        batch = self.state.resume(source, time.time(), self.holder.current.version)
        if batch is not None:
            await self.writer.submit(batch)

    def _clock_sample(self, source: str, delay: float) -> None:
        """Gateway time minus publisher time for live batches: the smallest recent value is the clock offset
        plus the least transit delay, the best estimate available without the publisher's cooperation."""
        samples = self._clock_samples.setdefault(source, deque(maxlen=CLOCK_SAMPLES))
        samples.append(delay)
        self.clock_offsets[source] = min(samples)

    # -- writer callbacks ------------------------------------------------------------------------

    def _applied(self, batch: BatchOps) -> None:
        self.metrics.applied(batch, self.holder.current)
        self.metrics.resident(self.state.resident_counts, self.holder.current)

    def _dropped(self, batch: BatchOps) -> None:
        log.warning("ledger_spool_full", source=batch.source, seq=batch.seq, ops=batch.size)
        self.metrics.missing(batch.source, 1)
        self.metrics.spool_dropped(batch.size)

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
        """Keep one subscriber running for the source; a crash resumes from the last batch handled (whose
        continuity the new subscriber proves again)."""
        while True:
            subscriber = Subscriber(spec, self, self._cursors.get(spec.name), self.config.timing(), self._zmq,
                                    silent=spec.name in self.state.silent)
            try:
                await subscriber.run()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # any failure restarts the subscriber, counted
                log.error("kv_events_subscriber_failed", source=spec.name, error=repr(error)[:300])
                self.metrics.task_restarted(f"kv-events:{spec.name}")
            finally:
                if subscriber.tracker.cursor is None:
                    self._cursors.pop(spec.name, None)  # a proven restart: the old cursor must not come back
                else:
                    self._cursors[spec.name] = subscriber.tracker.cursor
            await asyncio.sleep(RESUBSCRIBE_DELAY_S)

    # -- periodic work -----------------------------------------------------------------------------

    async def _salt_refresh_loop(self) -> None:
        """User salts issued by other replicas, and operator resets, reach this one through the store."""
        while True:
            await asyncio.sleep(self.config.salt_refresh_s)
            try:
                await self._refresh_salts()
                await self._pick_up_resets()
                await self._remember_policies()
            except Exception as error:  # the store is away or failing: try again next round
                self.metrics.store_error(type(error).__name__ if not isinstance(error, StoreUnavailable)
                                         else "unavailable")

    async def _pick_up_resets(self) -> None:
        """`kvgate ledger reset-source` closes records in the store; reload that source's open blocks."""
        resets = {(e.source, e.boundary_ts) for e in await self.store.source_events() if e.kind == "reset"}
        new = resets - self._resets_seen
        if not new:
            return
        rows = await self.store.open_blocks()
        for source in {source for source, _ts in new}:
            self.state.replace_source(source, [row for row in rows if row.source == source])
        self._resets_seen |= new

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

    async def _refresh_salts(self) -> None:
        entries, self._salt_position = await self.store.salt_entries(self._salt_position)
        if entries:
            self.salts.add_users(entries)
            self.metrics.user_salts(self.salts.remembered)

    async def _compaction_loop(self) -> None:
        """Closed records past the horizon leave the store; the audit's totals (kept by the store) keep them."""
        if not isinstance(self.store, CompactingStore):
            log.info("ledger_compaction_unavailable", store=type(self.store).__name__)
            await asyncio.Event().wait()  # nothing to do for this store, ever
            return
        store: CompactingStore = self.store
        while True:
            await asyncio.sleep(self.config.compact_interval_s)
            retentions = [tenant.offload.retention_seconds for tenant in self.holder.current.tenants.values()
                          if tenant.offload.retention_seconds is not None]
            horizon = compaction_horizon(self.config.compact_after_s, retentions)
            try:
                deleted = await store.compact(time.time() - horizon)
            except Exception as error:  # retried next interval
                self.metrics.store_error(type(error).__name__)
                continue
            if deleted:
                log.info("ledger_compacted", records=deleted, horizon_s=horizon)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            policies = self.holder.current
            retention = {name: tenant.offload.retention_seconds for name, tenant in policies.tenants.items()
                         if tenant.offload.retention_seconds is not None}
            for found in self.state.flag_overdue(time.time(), retention, self.clock_offsets):
                self.metrics.overdue(found, policies)
                await asyncio.sleep(0)  # let requests through between chunks
            if self.clock_offsets:
                try:
                    await self.store.record_clock(dict(self.clock_offsets), time.time())
                except Exception as error:  # reported next round; the estimate stays in memory
                    self.metrics.store_error(type(error).__name__)
