"""Where the reuse trace lives: the gateway's SQLite file, or Redis (`KVGATE_REDIS_URL`) for several replicas.

Bounded per tenant: at most `max_records` records (the oldest go first) of at most MAX_CHUNKS fingerprints
each. Records older than the tenant's `offload.retention_seconds` are deleted, and `tenant forget` erases the
tenant's records (all of them from the CLI; those below the new salt epoch in a running gateway).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Awaitable, Iterable
from pathlib import Path
from typing import Any, Protocol, cast

import redis.asyncio as aioredis

from gateway.reuse.record import TraceRecord, decode_record, encode_record

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
    async def close(self) -> None: ...


class SqliteTraceStore:
    """One table; calls run in a worker thread so the event loop never blocks on the file."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS reuse_trace (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, ts REAL NOT NULL, "
        "epoch INTEGER NOT NULL, record BLOB NOT NULL)",
        "CREATE INDEX IF NOT EXISTS reuse_trace_tenant ON reuse_trace (tenant, id)",
        "CREATE INDEX IF NOT EXISTS reuse_trace_tenant_ts ON reuse_trace (tenant, ts)",
    )
    TRIM_SQL = (
        "DELETE FROM reuse_trace WHERE tenant = ? AND id <= "
        "(SELECT id FROM reuse_trace WHERE tenant = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
    )

    def __init__(self, path: Path, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.max_records = max_records
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # a trace may lose its last batch on power loss, no more
        for statement in self.SCHEMA:
            self._db.execute(statement)

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _change(self, sql: str, args: tuple[Any, ...]) -> int:
        with self._lock:
            return self._db.execute(sql, args).rowcount

    async def write(self, records: list[TraceRecord]) -> None:
        if records:
            await asyncio.to_thread(self._write, records)

    def _write(self, records: list[TraceRecord]) -> None:
        rows = [(r.tenant, r.ts, r.epoch, encode_record(r)) for r in records]
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT INTO reuse_trace (tenant, ts, epoch, record) VALUES (?, ?, ?, ?)", rows)
                tenants = {r.tenant for r in records}
                self._db.executemany(self.TRIM_SQL, [(t, t, self.max_records) for t in tenants])
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    async def read(self, tenant: str | None, since: float | None) -> list[TraceRecord]:
        sql = ("SELECT record FROM reuse_trace WHERE (? IS NULL OR tenant = ?) AND (? IS NULL OR ts >= ?) "
               "ORDER BY id")
        rows = await asyncio.to_thread(self._run, sql, (tenant, tenant, since, since))
        return [decode_record(row[0]) for row in rows]

    async def tenants(self) -> list[str]:
        rows = await asyncio.to_thread(self._run, "SELECT DISTINCT tenant FROM reuse_trace ORDER BY tenant")
        return [str(row[0]) for row in rows]

    async def expire(self, tenant: str, before: float) -> int:
        sql = "DELETE FROM reuse_trace WHERE tenant = ? AND ts < ?"
        return await asyncio.to_thread(self._change, sql, (tenant, before))

    async def erase(self, tenant: str, below_epoch: int | None = None) -> int:
        if below_epoch is None:
            return await asyncio.to_thread(self._change, "DELETE FROM reuse_trace WHERE tenant = ?", (tenant,))
        sql = "DELETE FROM reuse_trace WHERE tenant = ? AND epoch < ?"
        return await asyncio.to_thread(self._change, sql, (tenant, below_epoch))

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisTraceStore:
    """One sorted set per tenant, scored by time; members are the encoded records (each has its own time and
    chain, and a sequence number makes equal records distinct)."""

    def __init__(self, url: str, max_records: int = DEFAULT_MAX_RECORDS, prefix: str = REDIS_PREFIX) -> None:
        self._redis = aioredis.Redis.from_url(url)
        self.max_records = max_records
        self.prefix = prefix

    def _key(self, tenant: str) -> str:
        return f"{self.prefix}:trace:{tenant}"

    async def write(self, records: list[TraceRecord]) -> None:
        if not records:
            return
        counter = f"{self.prefix}:seq"
        first = await cast(Awaitable[int], self._redis.incrby(counter, len(records)))
        async with self._redis.pipeline(transaction=True) as pipe:
            for offset, record in enumerate(records):
                member = (first - len(records) + offset).to_bytes(8, "big") + encode_record(record)
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
        removed = self._redis.zremrangebyscore(self._key(tenant), "-inf", f"({before}")
        return await cast(Awaitable[int], removed)

    async def erase(self, tenant: str, below_epoch: int | None = None) -> int:
        key = self._key(tenant)
        if below_epoch is None:
            count = await cast(Awaitable[int], self._redis.zcard(key))
            await self._redis.delete(key)
            return count
        raw = await cast(Awaitable[list[bytes]], self._redis.zrange(key, 0, -1))
        stale = [member for member in raw if decode_record(member[8:]).epoch < below_epoch]
        if stale:
            await cast(Awaitable[int], self._redis.zrem(key, *stale))
        return len(stale)

    async def close(self) -> None:
        await self._redis.aclose()


def open_trace_store(redis_url: str | None, state_path: Path, max_records: int = DEFAULT_MAX_RECORDS) -> TraceStore:
    if redis_url:
        return RedisTraceStore(redis_url, max_records)
    return SqliteTraceStore(state_path, max_records)


def tenants_of(records: Iterable[TraceRecord]) -> list[str]:
    return sorted({r.tenant for r in records})
