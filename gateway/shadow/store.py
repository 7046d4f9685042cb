"""Where shadow pairs and counters live: the ledger's SQLite file, or Redis for several replicas."""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, Protocol, cast

import msgspec
import redis.asyncio as aioredis

from gateway.shadow.compare import PairRecord

KEEP_PAIRS = 5000  # per tenant: enough for stable quantiles, bounded in size
REDIS_PREFIX = "kvgate:shadow"


OutcomeCounts = dict[tuple[str, str], int]  # (tenant, outcome) → how many more


class ShadowStore(Protocol):
    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        """Append pairs and add to outcome counters, all in one atomic write."""
    async def pairs(self, tenant: str) -> list[PairRecord]: ...
    async def counts(self, tenant: str) -> dict[str, int]: ...
    async def close(self) -> None: ...


def _encode(pair: PairRecord) -> bytes:
    return msgspec.json.encode(dataclasses.asdict(pair))


def _decode(raw: bytes | str) -> PairRecord:
    return PairRecord(**msgspec.json.decode(raw))


class SqliteShadowStore:
    """One table of pairs and one of counters; calls run in a worker thread so the loop never blocks."""

    SCHEMA = (
        "CREATE TABLE IF NOT EXISTS shadow_pairs (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, pair BLOB NOT NULL)",
        "CREATE INDEX IF NOT EXISTS shadow_pairs_tenant ON shadow_pairs (tenant, id)",
        "CREATE TABLE IF NOT EXISTS shadow_counts (tenant TEXT NOT NULL, outcome TEXT NOT NULL, "
        "n INTEGER NOT NULL, PRIMARY KEY (tenant, outcome))",
    )

    COUNT_SQL = (
        "INSERT INTO shadow_counts VALUES (?, ?, ?) ON CONFLICT (tenant, outcome) DO UPDATE SET n = n + excluded.n"
    )

    TRIM_SQL = (
        "DELETE FROM shadow_pairs WHERE tenant = ? AND id <= "
        "(SELECT id FROM shadow_pairs WHERE tenant = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
    )

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        # Shadow statistics may lose the last writes on a power cut, never their consistency; skipping the
        # per-commit fsync keeps each pair cheap.
        self._db.execute("PRAGMA synchronous=NORMAL")
        for statement in self.SCHEMA:
            self._db.execute(statement)

    def _run(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        rows = [(pair.tenant, _encode(pair)) for pair in pairs]
        await asyncio.to_thread(self._write, rows, [(*key, n) for key, n in counts.items()])

    def _write(self, rows: list[tuple[str, bytes]], counts: list[tuple[str, str, int]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany("INSERT INTO shadow_pairs (tenant, pair) VALUES (?, ?)", rows)
                self._db.executemany(self.TRIM_SQL, [(tenant, tenant, KEEP_PAIRS) for tenant in {t for t, _ in rows}])
                self._db.executemany(self.COUNT_SQL, counts)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    async def pairs(self, tenant: str) -> list[PairRecord]:
        sql = "SELECT pair FROM shadow_pairs WHERE tenant = ? ORDER BY id DESC LIMIT ?"
        rows = await asyncio.to_thread(self._run, sql, (tenant, KEEP_PAIRS))
        return [_decode(row[0]) for row in rows]

    async def counts(self, tenant: str) -> dict[str, int]:
        rows = await asyncio.to_thread(self._run, "SELECT outcome, n FROM shadow_counts WHERE tenant = ?", (tenant,))
        return {str(outcome): int(n) for outcome, n in rows}

    async def close(self) -> None:
        with self._lock:
            self._db.close()


class RedisShadowStore:
    """A capped list of pairs and a hash of counters per tenant, shared by every replica."""

    def __init__(self, url: str) -> None:
        self._redis = aioredis.Redis.from_url(url)

    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for tenant in {pair.tenant for pair in pairs}:
                key = f"{REDIS_PREFIX}:pairs:{tenant}"
                pipe.lpush(key, *[_encode(pair) for pair in pairs if pair.tenant == tenant])
                pipe.ltrim(key, 0, KEEP_PAIRS - 1)
            for (tenant, outcome), n in counts.items():
                pipe.hincrby(f"{REDIS_PREFIX}:counts:{tenant}", outcome, n)
            await pipe.execute()

    async def pairs(self, tenant: str) -> list[PairRecord]:
        pending = self._redis.lrange(f"{REDIS_PREFIX}:pairs:{tenant}", 0, KEEP_PAIRS - 1)
        raw = await cast(Awaitable[list[bytes]], pending)
        return [_decode(item) for item in raw]

    async def counts(self, tenant: str) -> dict[str, int]:
        raw = await cast(Awaitable[dict[bytes, bytes]], self._redis.hgetall(f"{REDIS_PREFIX}:counts:{tenant}"))
        return {key.decode(): int(value) for key, value in raw.items()}

    async def close(self) -> None:
        await self._redis.aclose()


def open_shadow_store(redis_url: str | None, state_path: Path) -> ShadowStore:
    if redis_url:
        return RedisShadowStore(redis_url)
    return SqliteShadowStore(state_path)
