"""Where the gateway keeps shared state, chosen once per process: one SQLite file (one connection on one thread,
shared by every store) or one Redis client pool (shared by every store) when `KVGATE_REDIS_URL` is set.

Stores (the ledger, shadow pairs, and the features that keep state) are built on a `Storage`, never on a URL or a
path of their own, so one process opens one SQLite connection or one Redis pool, and the backend is decided in
one place.

The Redis client (about 4 MiB resident once imported) is loaded only by a process whose storage is Redis, or
by a store that is (a `kvgate audit` on a Redis ledger): a SQLite gateway never imports it. Code that runs on
either backend names Redis's errors through `errors_with_redis()`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, cast

from gateway.storage.sqlite import SqliteWorker

if TYPE_CHECKING:
    import redis.asyncio as aioredis

DEFAULT_REDIS_TIMEOUT_S = 2.0


class Backend(StrEnum):
    SQLITE = "sqlite"
    REDIS = "redis"


@dataclass
class Storage:
    backend: Backend
    sqlite: SqliteWorker | None = None
    redis: aioredis.Redis | None = None
    redis_url: str | None = None  # what `redis` is connected to, so a store configured elsewhere can tell

    @classmethod
    async def open(cls, redis_url: str | None, state_path: Path,
                   redis_timeout_s: float = DEFAULT_REDIS_TIMEOUT_S) -> Storage:
        if redis_url:
            import redis.asyncio as aioredis

            client = aioredis.Redis.from_url(redis_url, socket_timeout=redis_timeout_s,
                                             socket_connect_timeout=redis_timeout_s)
            return cls(Backend.REDIS, redis=client, redis_url=redis_url)
        return cls(Backend.SQLITE, sqlite=await SqliteWorker.open(state_path))

    def sqlite_worker(self) -> SqliteWorker:
        if self.sqlite is None:
            raise RuntimeError("this process stores state in Redis, not SQLite")
        return self.sqlite

    def redis_client(self) -> aioredis.Redis:
        if self.redis is None:
            raise RuntimeError("this process stores state in SQLite, not Redis")
        return self.redis

    async def close(self) -> None:
        if self.sqlite is not None:
            await self.sqlite.close()
        if self.redis is not None:
            await self.redis.aclose()


def errors_with_redis(*others: type[Exception]) -> tuple[type[Exception], ...]:
    """`others` and Redis's error base, for an `except` clause that may see either backend. Redis's is left
    out while this process has not loaded the Redis client, since nothing can raise its errors then (importing
    the client only to name them would keep it resident in every SQLite gateway)."""
    exceptions = sys.modules.get("redis.exceptions")
    return others if exceptions is None else (*others, cast(type[Exception], exceptions.RedisError))
