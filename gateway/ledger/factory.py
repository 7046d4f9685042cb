"""Pick the store backend from the process settings: Redis when `KVGATE_REDIS_URL` is set, else SQLite."""

from __future__ import annotations

from gateway.ledger.base import LedgerStore
from gateway.ledger.redis_store import RedisStore
from gateway.ledger.sqlite_store import BUSY_TIMEOUT_MS, SqliteStore
from gateway.settings import Settings


async def open_store(settings: Settings, redis_prefix: str, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> LedgerStore:
    if settings.redis_url:
        return await RedisStore.open(settings.redis_url, prefix=redis_prefix)
    return await SqliteStore.open(settings.state_path, busy_timeout_ms)
