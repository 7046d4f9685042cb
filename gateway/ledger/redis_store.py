"""Redis ledger store, shared by several gateway replicas (`KVGATE_REDIS_URL`).

Writes go through one Lua script per flush (see `redis_script`), so each batch applies atomically and at
most once across replicas and replays. Connection failures surface as `StoreUnavailable`; the writer
keeps the batches in its spool meanwhile.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import msgspec
import redis.asyncio as aioredis
import redis.exceptions

from gateway.kvevents.sequence import Cursor
from gateway.ledger.base import StoreUnavailable
from gateway.ledger.hashcodec import from_token, to_token
from gateway.ledger.records import (
    BatchOps,
    BlockRecord,
    ClearOp,
    CloseOp,
    CopiesOp,
    GapRecord,
    Op,
    OpenBlock,
    OpenOp,
    ResumeOp,
    SaltDigestEntry,
    SilenceOp,
    SourceEvent,
    TenantPolicyRecord,
)
from gateway.ledger.redis_script import APPLY_LUA, REMEMBER_SALTS_LUA

T = TypeVar("T")
DEFAULT_PREFIX = "kvgate:ledger:"
MARKER_TTL_S = 86_400
OPS_PER_CALL = 20_000  # keeps one script call short, so Redis stays responsive to other clients
SEP = "\x1f"
NO_VALUE = -1
UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class RedisStore:
    def __init__(self, client: aioredis.Redis, prefix: str = DEFAULT_PREFIX) -> None:
        self.client = client
        self.prefix = prefix
        self._apply = client.register_script(APPLY_LUA)
        self._remember = client.register_script(REMEMBER_SALTS_LUA)

    @classmethod
    async def open(cls, url: str, prefix: str = DEFAULT_PREFIX, timeout_s: float = 2.0) -> RedisStore:
        client = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        return cls(client, prefix)

    async def close(self) -> None:
        await self.client.aclose()

    # -- writes ----------------------------------------------------------------------------------

    async def apply(self, batches: Sequence[BatchOps]) -> list[bool]:
        applied: list[bool] = []
        for chunk in _chunks(batches):
            payload = msgspec.msgpack.encode([_wire_batch(batch) for batch in chunk])
            result = await self._call(self._apply, args=[self.prefix, MARKER_TTL_S, payload])
            applied.extend(bool(flag) for flag in result)
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
        return [OpenBlock(row[0], row[1], from_token(row[2]), row[4], _epoch(row[5]), float(row[6]), _copies(row),
                          _unknown_since(row) is not None)
                async for row in self._record_rows() if row[7] == NO_VALUE]

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
        records = []
        async for row in self._record_rows():
            record = _block_record(row)
            if tenant is not None and record.tenant != tenant:
                continue
            if since is None or record.removed_at is None or record.removed_at >= since:
                records.append(record)
        return records

    async def _record_rows(self) -> AsyncIterator[list[Any]]:
        async with self._guard():
            async for _id, packed in self.client.hscan_iter(self._key("rec"), count=5000):
                yield msgspec.msgpack.decode(packed)

    async def missing_batches(self) -> dict[str, int]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("gaps")))
        totals: dict[str, int] = {}
        for field, missing in raw.items():
            source = field.decode().split(SEP, 1)[0]
            totals[source] = totals.get(source, 0) + int(missing)
        return totals

    async def source_events(self) -> list[SourceEvent]:
        async with self._guard():
            raw = await _resolved(self.client.hgetall(self._key("events")))
        events = [_source_event(msgspec.msgpack.decode(packed)) for packed in raw.values()]
        return sorted(events, key=lambda event: event.learned_at)

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


def _chunks(batches: Sequence[BatchOps]) -> list[list[BatchOps]]:
    chunks: list[list[BatchOps]] = [[]]
    size = 0
    for batch in batches:
        if size + batch.size > OPS_PER_CALL and chunks[-1]:
            chunks.append([])
            size = 0
        chunks[-1].append(batch)
        size += batch.size
    return [chunk for chunk in chunks if chunk]


def _wire_batch(batch: BatchOps) -> list[Any]:
    return [batch.source, batch.seq, repr(batch.ts), batch.policy_version, [_wire_op(op) for op in batch.ops]]


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


def _salt_entry(row: list[Any]) -> SaltDigestEntry:
    return SaltDigestEntry(row[0], int(row[1]), bytes.fromhex(row[2]))


def _source_event(row: list[Any]) -> SourceEvent:
    return SourceEvent(row[0], row[1], float(row[2]), float(row[3]), int(row[4]))
