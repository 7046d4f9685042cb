"""Where the reuse trace lives: on the process's Storage — its SQLite file, or Redis (`KVGATE_REDIS_URL`) for
several replicas.

Bounded per tenant: at most `max_records` records (the oldest go first) of at most MAX_CHUNKS fingerprints
each. On SQLite each tenant's record count is kept by triggers in the same file (`reuse_trace_counts`), so the
bound costs one lookup per tenant and batch; finding the cut by `OFFSET max_records` walked that many index
entries instead (about 1.3 ms per tenant and flush at 50,000 records).

Records older than the tenant's `offload.retention_seconds` are deleted, and `tenant forget` erases the tenant's
records (all of them from the CLI; those below the new salt epoch in a running gateway).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from gateway.reuse.record import TraceRecord, decode_record, encode_record
from gateway.storage import Backend, Storage
from gateway.storage.sqlite import SqliteWorker

if TYPE_CHECKING:
    import redis.asyncio as aioredis

DEFAULT_MAX_RECORDS = 50_000
REDIS_PREFIX = "kvgate:reuse"


class TraceStore(Protocol):
    async def write(self, records: list[TraceRecord]) -> None: ...
    async def read(self, tenant: str | None, since: float | None) -> list[TraceRecord]:
        """Records in time order, of one tenant or all."""
    async def tenants(self) -> list[str]: ...
    async def expire(self, tenant: str, before: float) -> int:
        """Delete the tenant's records older than `before` (unix time); returns how many."""
    async def erase(self, tenant: str, below_epoch: int | None = None) -> int:
        """Delete the tenant's records (only those below a salt epoch when given); returns how many."""


SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reuse_trace (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, ts REAL NOT NULL, "
    "epoch INTEGER NOT NULL, record BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS reuse_trace_tenant ON reuse_trace (tenant, id)",
    "CREATE INDEX IF NOT EXISTS reuse_trace_tenant_ts ON reuse_trace (tenant, ts)",
)
# Created once, with the counts of the rows already there (a file from before the counts); in one transaction,
# so two processes opening the same file cannot both count.
COUNTS_SCHEMA = (
    "CREATE TABLE reuse_trace_counts (tenant TEXT PRIMARY KEY, records INTEGER NOT NULL) WITHOUT ROWID",
    "CREATE TRIGGER reuse_trace_counted AFTER INSERT ON reuse_trace BEGIN "
    "INSERT INTO reuse_trace_counts (tenant, records) VALUES (NEW.tenant, 1) "
    "ON CONFLICT (tenant) DO UPDATE SET records = records + 1; END",
    "CREATE TRIGGER reuse_trace_uncounted AFTER DELETE ON reuse_trace BEGIN "
    "UPDATE reuse_trace_counts SET records = records - 1 WHERE tenant = OLD.tenant; END",
    "INSERT INTO reuse_trace_counts (tenant, records) SELECT tenant, COUNT(*) FROM reuse_trace GROUP BY tenant",
)
COUNT_SQL = "SELECT records FROM reuse_trace_counts WHERE tenant = ?"
TRIM_SQL = "DELETE FROM reuse_trace WHERE id IN (SELECT id FROM reuse_trace WHERE tenant = ? ORDER BY id LIMIT ?)"
READ_SQL = ("SELECT record FROM reuse_trace WHERE (? IS NULL OR tenant = ?) AND (? IS NULL OR ts >= ?) "
            "ORDER BY id")


class SqliteTraceStore:
    """One table on the process's SQLite worker."""

    def __init__(self, worker: SqliteWorker, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.worker = worker
        self.max_records = max_records

    @classmethod
    async def open(cls, worker: SqliteWorker, max_records: int = DEFAULT_MAX_RECORDS) -> SqliteTraceStore:
        await worker.transaction(_create)
        return cls(worker, max_records)

    async def write(self, records: list[TraceRecord]) -> None:
        if records:
            rows = [(r.tenant, r.ts, r.epoch, encode_record(r)) for r in records]
            await self.worker.transaction(_write, rows, sorted({r.tenant for r in records}), self.max_records)

    async def read(self, tenant: str | None, since: float | None) -> list[TraceRecord]:
        rows = await self.worker.run(_fetch, READ_SQL, (tenant, tenant, since, since))
        return [decode_record(row[0]) for row in rows]

    async def tenants(self) -> list[str]:
        rows = await self.worker.run(_fetch, "SELECT DISTINCT tenant FROM reuse_trace ORDER BY tenant", ())
        return [str(row[0]) for row in rows]

    async def expire(self, tenant: str, before: float) -> int:
        return await self.worker.run(_change, "DELETE FROM reuse_trace WHERE tenant = ? AND ts < ?", (tenant, before))

    async def erase(self, tenant: str, below_epoch: int | None = None) -> int:
        if below_epoch is None:
            return await self.worker.run(_change, "DELETE FROM reuse_trace WHERE tenant = ?", (tenant,))
        sql = "DELETE FROM reuse_trace WHERE tenant = ? AND epoch < ?"
        return await self.worker.run(_change, sql, (tenant, below_epoch))


def _create(db: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        db.execute(statement)
    counted = db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'reuse_trace_counts'")
    if counted.fetchone() is None:
        for statement in COUNTS_SCHEMA:
            db.execute(statement)


def _write(db: sqlite3.Connection, rows: list[tuple[str, float, int, bytes]], tenants: list[str], keep: int) -> None:
    db.executemany("INSERT INTO reuse_trace (tenant, ts, epoch, record) VALUES (?, ?, ?, ?)", rows)
    for tenant in tenants:
        found = db.execute(COUNT_SQL, (tenant,)).fetchone()
        excess = (found[0] if found is not None else 0) - keep
        if excess > 0:
            db.execute(TRIM_SQL, (tenant, excess))


def _fetch(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return db.execute(sql, args).fetchall()


def _change(db: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> int:
    return db.execute(sql, args).rowcount


class RedisTraceStore:
    """One sorted set per tenant, scored by time; members are a sequence number and the encoded record."""

    def __init__(self, client: aioredis.Redis, max_records: int = DEFAULT_MAX_RECORDS,
                 prefix: str = REDIS_PREFIX) -> None:
        self._redis = client
        self.max_records = max_records
        self.prefix = prefix

    def _key(self, tenant: str) -> str:
        return f"{self.prefix}:trace:{tenant}"

    async def write(self, records: list[TraceRecord]) -> None:
        if not records:
            return
        last = await cast(Awaitable[int], self._redis.incrby(f"{self.prefix}:seq", len(records)))
        async with self._redis.pipeline(transaction=True) as pipe:
            for offset, record in enumerate(records):
                member = (last - len(records) + offset).to_bytes(8, "big") + encode_record(record)
                pipe.zadd(self._key(record.tenant), {member: record.ts})
            for tenant in {r.tenant for r in records}:
                pipe.zremrangebyrank(self._key(tenant), 0, -(self.max_records + 1))
            await pipe.execute()

    async def read(self, tenant: str | None, since: float | None) -> list[TraceRecord]:
        tenants = [tenant] if tenant is not None else await self.tenants()
        low: float | str = since if since is not None else "-inf"
        records: list[TraceRecord] = []
        for name in tenants:
            raw = await cast(Awaitable[list[bytes]], self._redis.zrangebyscore(self._key(name), low, "+inf"))
            records.extend(decode_record(member[8:]) for member in raw)
        records.sort(key=lambda r: r.ts)
        return records

    async def tenants(self) -> list[str]:
        prefix = self._key("")
        names = [key.decode()[len(prefix):] async for key in self._redis.scan_iter(match=f"{prefix}*")]
        return sorted(names)

    async def expire(self, tenant: str, before: float) -> int:
        return await cast(Awaitable[int], self._redis.zremrangebyscore(self._key(tenant), "-inf", f"({before}"))

    async def erase(self, tenant: str, below_epoch: int | None = None) -> int:
        key = self._key(tenant)
        if below_epoch is None:
            async with self._redis.pipeline(transaction=True) as pipe:  # MULTI: the count is of what was deleted
                pipe.zcard(key)
                pipe.delete(key)
                count, _deleted = await pipe.execute()
            return int(count)
        raw = await cast(Awaitable[list[bytes]], self._redis.zrange(key, 0, -1))
        stale = [member for member in raw if decode_record(member[8:]).epoch < below_epoch]
        if stale:
            await cast(Awaitable[int], self._redis.zrem(key, *stale))
        return len(stale)


async def open_trace_store(storage: Storage, max_records: int = DEFAULT_MAX_RECORDS) -> TraceStore:
    if storage.backend is Backend.REDIS:
        return RedisTraceStore(storage.redis_client(), max_records)
    return await SqliteTraceStore.open(storage.sqlite_worker(), max_records)


@asynccontextmanager
async def trace_store_for(redis_url: str | None, state_path: Path) -> AsyncIterator[TraceStore]:
    """The trace store of a gateway's settings, for a command-line tool; closed on exit."""
    storage = await Storage.open(redis_url, state_path)
    try:
        yield await open_trace_store(storage)
    finally:
        await storage.close()
