"""Redis ledger store, shared by several gateway replicas (`KVGATE_REDIS_URL`).

Writes go through one Lua script per flush (see `redis_script`), so each batch applies atomically and at
most once across replicas and replays. Connection failures surface as `StoreUnavailable`; the writer
keeps the batches in its spool meanwhile.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any, NamedTuple, TypeVar

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from gateway.kvevents.sequence import Cursor
from gateway.ledger.audit import retention_limits
from gateway.ledger.base import AuditReadRaced, StoreUnavailable
from gateway.ledger.hashcodec import from_token, to_token
from gateway.ledger.records import (
    BatchOps,
    BlockRecord,
    ClearOp,
    CloseCount,
    CloseOp,
    CopiesOp,
    GapRecord,
    LedgerSummary,
    LifetimeStats,
    Op,
    OpenBlock,
    OpenOp,
    ResumeOp,
    SaltDigestEntry,
    SilenceOp,
    SourceEvent,
    TallyRow,
    TenantPolicyRecord,
    WindowedRead,
)
from gateway.ledger.redis_script import (
    APPLY_LUA,
    AUDIT_SNAPSHOT_LUA,
    BACKFILL_LUA,
    COMPACT_LUA,
    REMEMBER_SALTS_LUA,
)
from gateway.ledger.report import AuditInputs, Window, build_summary_report
from gateway.policy.loader import PolicySet

T = TypeVar("T")
DEFAULT_PREFIX = "kvgate:ledger:"
MARKER_TTL_S = 86_400
WINDOWED_READ_ATTEMPTS = 5  # source-wide changes are rare (a silence takes `lost_after_s` of quiet)
SCAN_PAGE = 5_000  # records per HSCAN call of a windowed audit
OPS_PER_CALL = 5_000  # keeps one script call short (well under a client's 2 s timeout), so Redis stays responsive
COMPACT_SLICE = 10_000  # closed records deleted per script call; the event loop and Redis breathe in between
SEP = "\x1f"
NO_VALUE = -1
UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class RedisStore:
    """`owns_client`: False when the client is the process's shared pool (`Storage.redis_client()`), which
    its owner closes."""

    def __init__(self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX, owns_client: bool = True) -> None:
        self.client = client
        self.prefix = prefix
        self.owns_client = owns_client
        self.compact_slice = COMPACT_SLICE
        self.ops_per_call = OPS_PER_CALL
        self.scan_page = SCAN_PAGE
        self._apply = client.register_script(APPLY_LUA)
        self._remember = client.register_script(REMEMBER_SALTS_LUA)
        self._backfill = client.register_script(BACKFILL_LUA)
        self._compact = client.register_script(COMPACT_LUA)
        self._audit_snapshot = client.register_script(AUDIT_SNAPSHOT_LUA)

    @classmethod
    async def open(cls, url: str, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0) -> RedisStore:
        client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return await cls.on_client(client, prefix, owns_client=True)

    @classmethod
    async def on_client(cls, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX,
                        owns_client: bool = False) -> RedisStore:
        """A store on an existing client (by default the shared pool, left open by `close`)."""
        store = cls(client, prefix, owns_client)
        await store.ensure_aggregates()
        return store

    async def ensure_aggregates(self) -> int:
        """Build the audit's totals from the records once, for a ledger written before they existed; records
        read (0 when the totals were already there). Redis unreachable now: the first audit retries it."""
        try:
            return int(await self._call(self._backfill, args=[self.prefix]))
        except StoreUnavailable:
            return 0

    async def close(self) -> None:
        if self.owns_client:
            await self.client.aclose()

    # -- writes ----------------------------------------------------------------------------------

    async def apply(self, batches: Sequence[BatchOps]) -> list[bool]:
        """At most OPS_PER_CALL operations per script call: a large batch goes in slices (see `redis_script`),
        so no call keeps Redis from other clients for long, whatever a publisher sends."""
        applied: list[bool] = []
        for call in _calls(batches, self.ops_per_call):
            while call:
                payload = msgspec.msgpack.encode([_wire_part(part) for part in call])
                resume, *flags = await self._call(self._apply,
                                                  args=[self.prefix, MARKER_TTL_S, payload, self.ops_per_call])
                done = call if resume == 0 else call[: resume - 1]
                applied.extend(bool(flag) for part, flag in zip(done, flags, strict=False) if part.last)
                call = [] if resume == 0 else call[resume - 1 :]
        return applied

    async def record_gaps(self, gaps: Sequence[GapRecord]) -> None:
        if not gaps:
            return
        async with self._guard():
            pipe = self.client.pipeline(transaction=False)
            for gap in gaps:
                field = SEP.join((gap.source, str(gap.first_seq), str(gap.last_seq), repr(gap.after_ts)))
                pipe.hsetnx(self._key("gaps"), field, str(gap.missing))
            await pipe.execute()

    async def remember_salts(self, entries: Sequence[SaltDigestEntry]) -> None:
        if entries:
            rows = [[entry.tenant, entry.epoch, entry.digest.hex()] for entry in entries]
            await self._call(self._remember, args=[self.prefix, msgspec.msgpack.encode(rows)])

    # -- reads -----------------------------------------------------------------------------------

    async def salt_entries(self, after: int) -> tuple[list[SaltDigestEntry], int]:
        async with self._guard():
            raw = await _resolved(self.client.lrange(self._key("salts"), after, -1))
        entries = [_salt_entry(msgspec.msgpack.decode(item)) for item in raw]
        return entries, after + len(entries)

    async def cursors(self) -> dict[str, Cursor]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("cursors")))
        cursors = {}
        for source, packed in raw.items():
            seq, ts = msgspec.msgpack.decode(packed)
            cursors[source.decode()] = Cursor(int(seq), float(ts))
        return cursors

    async def open_blocks(self) -> list[OpenBlock]:
        """Read through each source's open set, so the closed records kept until compaction are not decoded."""
        return [OpenBlock(row[0], row[1], from_token(row[2]), row[4], _epoch(row[5]), float(row[6]), _copies(row),
                          _unknown_since(row) is not None)
                async for row in self._open_rows() if row[7] == NO_VALUE]

    async def _open_rows(self) -> AsyncIterator[list[Any]]:
        await self._call(self._backfill, args=[self.prefix])  # the sources below come from the totals
        async with self._guard():
            groups = await _resolved(self.client.hkeys(self._key("openby")))
            sources = {group.decode().split(SEP, 1)[0] for group in groups} | set(await self.cursors())
            for source in sorted(sources):
                ids = [record_id async for _field, record_id in self.client.hscan_iter(self._key("open:" + source),
                                                                                        count=5000)]
                for start in range(0, len(ids), 5000):
                    packed = await _resolved(self.client.hmget(self._key("rec"), ids[start : start + 5000]))
                    for item in packed:
                        if item is not None:
                            yield msgspec.msgpack.decode(item)

    async def record_clock(self, offsets: dict[str, float], at: float) -> None:
        if offsets:
            async with self._guard():
                mapping = {source: msgspec.msgpack.encode([offset, at]) for source, offset in offsets.items()}
                await _resolved(self.client.hset(self._key("clock"), mapping=mapping))

    async def clock_offsets(self) -> dict[str, float]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("clock")))
        return {source.decode(): float(msgspec.msgpack.decode(packed)[0]) for source, packed in raw.items()}

    async def remember_policies(self, entries: Sequence[TenantPolicyRecord]) -> None:
        if entries:
            mapping = {e.tenant: msgspec.msgpack.encode([e.tenant, e.retention_s, list(e.media), e.policy_version,
                                                         e.seen_at]) for e in entries}
            async with self._guard():
                await _resolved(self.client.hset(self._key("policies"), mapping=mapping))

    async def tenant_policies(self) -> dict[str, TenantPolicyRecord]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("policies")))
        records = {}
        for packed in raw.values():
            tenant, retention, media, version, seen = msgspec.msgpack.decode(packed)
            records[tenant] = TenantPolicyRecord(tenant, retention, tuple(media), version, float(seen))
        return records

    async def records(self, since: float | None, tenant: str | None) -> list[BlockRecord]:
        """Read in HSCAN pages, each record once (HSCAN may return one twice while the hash grows)."""
        records: dict[bytes, BlockRecord] = {}
        async with self._guard():
            async for record_id, packed in self.client.hscan_iter(self._key("rec"), count=self.scan_page):
                record = _block_record(msgspec.msgpack.decode(packed))
                if tenant is not None and record.tenant != tenant:
                    continue
                if since is None or record.removed_at is None or record.removed_at >= since:
                    records[record_id] = record
        return list(records.values())

    async def windowed_read(self, since: float | None, tenant: str | None) -> WindowedRead:
        """The records are read in pages (a large ledger is never read in one call), so a change over a whole
        source (a silence marking its records unknown, a resumption, a restart closing them) could land in the
        middle; each such change is either in progress or has recorded its source event, so the records count
        only when read between two equal readings of both. Ordinary writes that land meanwhile are counted
        (`writes_during_read`): the report then says its records are not of one instant."""
        state = await self._source_state()
        for _attempt in range(WINDOWED_READ_ATTEMPTS):
            records = await self.records(since, tenant)
            missing = await self.missing_batches()
            after = await self._source_state()
            if after[:2] == state[:2]:
                events, changing, writes_before = state
                return WindowedRead(records, missing, events, changing, after[2] - writes_before)
            state = after
        raise AuditReadRaced(f"the ledger's sources changed state during each of {WINDOWED_READ_ATTEMPTS} reads")

    async def _source_state(self) -> tuple[list[SourceEvent], dict[str, list[str]], int]:
        """The source events, the changes in progress and the write counter, read together."""
        async with self._guard():
            pipe = self.client.pipeline(transaction=True)
            pipe.hvals(self._key("events"))
            pipe.hgetall(self._key("changing"))
            pipe.get(self._key("writes"))
            events, changing, writes = await pipe.execute()
        return _source_events(events), _changes_by_source(changing.items()), int(writes or 0)

    async def summary_report(
        self, policies: PolicySet, tenant: str | None, clock_offsets: dict[str, float], now: float,
    ) -> dict[str, Any]:
        """The unwindowed audit (`OneReadStore`): the totals, the gaps and the source events come from one
        script call, so an apply call is in the report whole or not at all (a silence's unknown records never
        without its `silent` event). The clock offsets and last policies, read before, only set the limits."""
        offsets = (await self.clock_offsets()) | clock_offsets
        last_policies = await self.tenant_policies()
        snapshot = await self._snapshot(retention_limits(policies, last_policies), offsets, now, tenant)
        inputs = AuditInputs([], snapshot.missing_batches, snapshot.source_events, offsets, last_policies,
                             snapshot.changes_in_progress)
        # Built on a worker thread: a large ledger must not stall the gateway's event loop.
        return await asyncio.to_thread(build_summary_report, snapshot.summary, inputs, policies,
                                       Window(now=now, since=None), tenant)

    async def _snapshot(
        self, limits: dict[str, float], offsets: dict[str, float], now: float, tenant: str | None,
    ) -> _AuditSnapshot:
        """The audit's totals as the SQLite store gives them (`sqlite_tally.summary`), read from the aggregates
        the apply script keeps: a few hashes, one lifetime histogram per (tenant, medium) and, per open
        (tenant, medium, source), the oldest stored_at and a ZCOUNT past retention. No record is read."""
        await self._call(self._backfill, args=[self.prefix])
        args = [self.prefix, tenant or "", "0" if tenant is None else "1", repr(now),
                msgspec.msgpack.encode(limits), msgspec.msgpack.encode(offsets)]
        tally, closes, compacted, gaps, events, changing, lifetimes, ages = await self._call(self._audit_snapshot,
                                                                                            args=args)
        tallies = [row for row in (_tally_row(field, packed) for field, packed in _pairs(tally))
                   if tenant is None or row.tenant == tenant]
        counts = [row for row in (_close_count(field, count) for field, count in _pairs(closes))
                  if tenant is None or row.tenant == tenant]
        overdue, oldest = _open_ages(ages, offsets, now)
        summary = LedgerSummary(tallies, counts, {_tenant_medium(pair): _lifetime_row(row) for pair, row in lifetimes},
                                overdue, oldest, float(compacted) if compacted else None)
        return _AuditSnapshot(summary, _missing_totals(_pairs(gaps)), _source_events(events),
                              _changes_by_source(_pairs(changing)))

    async def compact(self, before: float) -> int:
        """Delete closed records removed before `before`, a bounded slice per script call (the audit's totals
        keep them); returns how many."""
        deleted = 0
        while True:
            count = int(await self._call(self._compact, args=[self.prefix, repr(before), self.compact_slice]))
            deleted += count
            if count < self.compact_slice:
                return deleted

    async def missing_batches(self) -> dict[str, int]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("gaps")))
        return _missing_totals(raw.items())

    async def source_events(self) -> list[SourceEvent]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("events")))
        return _source_events(raw.values())

    # -- plumbing --------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return self.prefix + name

    async def _call(self, script: Callable[..., Awaitable[T]], args: list[Any]) -> T:
        async with self._guard():
            return await script(keys=[], args=args)
        raise AssertionError("unreachable")  # pragma: no cover - the guard re-raises

    @asynccontextmanager
    async def _guard(self) -> AsyncIterator[None]:
        try:
            yield
        except UNAVAILABLE as error:
            raise StoreUnavailable(f"redis: {error}") from error


async def _resolved(value: Awaitable[T] | T) -> T:
    """redis-py types commands as `Awaitable[T] | T` (one signature for sync and async clients)."""
    if inspect.isawaitable(value):
        return await value
    return value


class _AuditSnapshot(NamedTuple):
    """What one audit snapshot script call read."""

    summary: LedgerSummary
    missing_batches: dict[str, int]
    source_events: list[SourceEvent]
    changes_in_progress: dict[str, list[str]]


def _pairs(flat: list[Any]) -> list[tuple[Any, Any]]:
    """HGETALL's reply inside a script: field, value, field, value, ..."""
    return list(zip(flat[::2], flat[1::2], strict=True))


def _tenant_medium(pair: bytes) -> tuple[str, str]:
    tenant, medium = pair.decode().split(SEP)
    return tenant, medium


def _open_ages(
    ages: list[list[Any]], offsets: dict[str, float], now: float,
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], float]]:
    """Per (tenant, medium): open blocks past retention, and the oldest open block's age on its source's
    clock, from each open (source, tenant, medium) group's oldest stored_at and count past retention."""
    overdue: dict[tuple[str, str], int] = {}
    oldest: dict[tuple[str, str], float] = {}
    for group, first_stored, past_retention in ages:
        source, tenant, medium = group.decode().split(SEP, 2)
        key = (tenant, medium)
        age = now - offsets.get(source, 0.0) - float(first_stored)
        oldest[key] = max(oldest.get(key, 0.0), age)
        if int(past_retention) >= 0:
            overdue[key] = overdue.get(key, 0) + int(past_retention)
    return overdue, oldest


def _missing_totals(gaps: Iterable[tuple[bytes, bytes]]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for field, missing in gaps:
        source = field.decode().split(SEP, 1)[0]
        totals[source] = totals.get(source, 0) + int(missing)
    return totals


def _changes_by_source(changing: Iterable[tuple[bytes, bytes]]) -> dict[str, list[str]]:
    """Per source, the kinds (`silent`, `resumed`, a close reason) of ops over the whole source that a call left
    part done (`P..changing`): their records are partly changed and their source event is not recorded yet."""
    kinds: dict[str, list[str]] = {}
    for field, kind in changing:
        kinds.setdefault(field.decode().split(SEP, 1)[0], []).append(kind.decode())
    return {source: sorted(found) for source, found in kinds.items()}


def _source_events(packed_events: Iterable[bytes]) -> list[SourceEvent]:
    events = [_source_event(msgspec.msgpack.decode(packed)) for packed in packed_events]
    return sorted(events, key=lambda event: event.learned_at)


class _Part(NamedTuple):
    """A slice of one batch's operations, sent in one script call."""

    batch: BatchOps
    first: int
    ops: list[Op]
    last: bool


def _calls(batches: Sequence[BatchOps], budget: int) -> list[list[_Part]]:
    calls: list[list[_Part]] = [[]]
    room = budget
    for batch in batches:
        first = 0
        while True:
            if room <= 0:
                calls.append([])
                room = budget
            ops = batch.ops[first : first + room]
            last = first + len(ops) >= len(batch.ops)
            calls[-1].append(_Part(batch, first, ops, last))
            room -= max(1, len(ops))
            first += len(ops)
            if last:
                break
    return [call for call in calls if call]


def _wire_part(part: _Part) -> list[Any]:
    batch = part.batch
    return [batch.source, batch.seq, repr(batch.ts), batch.policy_version, [_wire_op(op) for op in part.ops],
            part.first, int(part.last)]


def _wire_op(op: Op) -> list[Any]:
    if isinstance(op, OpenOp):
        epoch = NO_VALUE if op.epoch is None else op.epoch
        return [1, op.medium, to_token(op.block_hash), to_token(op.parent_hash), op.tenant, epoch, op.stored_at]
    if isinstance(op, CloseOp):
        return [2, op.medium, to_token(op.block_hash), op.removed_at]
    if isinstance(op, CopiesOp):
        return [4, op.medium, to_token(op.block_hash), op.copies]
    if isinstance(op, SilenceOp):
        return [5, op.since]
    if isinstance(op, ResumeOp):
        return [6, op.at]
    assert isinstance(op, ClearOp)
    bound = NO_VALUE if op.stored_before is None else op.stored_before
    return [3, ",".join(op.media or ()), bound, op.at, op.reason]


def _epoch(value: Any) -> int | None:
    return None if value == NO_VALUE else int(value)


def _unknown_since(row: list[Any]) -> float | None:
    return None if len(row) < 12 or row[11] == NO_VALUE else float(row[11])


def _copies(row: list[Any]) -> int:
    return int(row[10]) if len(row) >= 11 else 1


def _block_record(row: list[Any]) -> BlockRecord:
    removed_at = None if row[7] == NO_VALUE else float(row[7])
    return BlockRecord(row[0], row[1], row[4], _epoch(row[5]), float(row[6]), removed_at, row[8] or None, row[9],
                       _unknown_since(row))


def _tally_row(field: bytes, packed: bytes) -> TallyRow:
    tenant, medium, epoch = field.decode().split(SEP)
    stored, removed, open_, unknown, has_last, last, has_longest, longest = msgspec.msgpack.decode(packed)
    return TallyRow(tenant, medium, _epoch(int(epoch)), int(stored), int(removed), int(open_), int(unknown),
                    float(last) if has_last else None, float(longest) if has_longest else None)


def _close_count(field: bytes, count: bytes) -> CloseCount:
    tenant, medium, epoch, closed_by = field.decode().split(SEP)
    return CloseCount(tenant, medium, _epoch(int(epoch)), closed_by, int(count))


def _lifetime_row(row: list[Any]) -> LifetimeStats:
    total, p50, p99, longest, outlived = row
    if not int(total):
        return LifetimeStats(0.0, 0.0, 0.0, 0)
    return LifetimeStats(float(p50), float(p99), float(longest), int(outlived))


def _salt_entry(row: list[Any]) -> SaltDigestEntry:
    return SaltDigestEntry(row[0], int(row[1]), bytes.fromhex(row[2]))


def _source_event(row: list[Any]) -> SourceEvent:
    return SourceEvent(row[0], row[1], float(row[2]), float(row[3]), int(row[4]))
