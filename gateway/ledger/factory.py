"""Pick the store backend from the process settings: Redis when `KVGATE_REDIS_URL` is set, else SQLite.

In a gateway the Redis store runs on the process's one Redis pool (`Storage.redis_client()`, issue 10's store
convention); it opens a client of its own only where there is no `Storage` (`kvgate audit`) or the `Storage`
is connected to another Redis than the ledger's settings name.
"""

from __future__ import annotations

from gateway.ledger.base import LedgerStore
from gateway.ledger.sqlite_store import BUSY_TIMEOUT_MS, SqliteStore
from gateway.settings import Settings
from gateway.storage import Backend, Storage


async def open_store(
    settings: Settings, redis_prefix: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS, storage: Storage | None = None,
) -> LedgerStore:
    if settings.redis_url:
        from gateway.ledger.redis_store import RedisStore  # the Redis client is loaded only for a Redis ledger

        if storage is not None and storage.backend is Backend.REDIS and storage.redis_url == settings.redis_url:
            return await RedisStore.on_client(storage.redis_client(), prefix=redis_prefix)
        return await RedisStore.open(settings.redis_url, prefix=redis_prefix)
    return await SqliteStore.open(settings.state_path, busy_timeout_ms)
