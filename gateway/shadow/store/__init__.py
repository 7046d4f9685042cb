"""The shadow store on the process's Storage: SQLite or Redis, as chosen once in gateway.storage."""

from __future__ import annotations

from gateway.shadow.store.base import KEEP_PAIRS, OutcomeCounts, ShadowStore
from gateway.shadow.store.redis import RedisShadowStore
from gateway.shadow.store.sqlite import SqliteShadowStore
from gateway.storage import Backend, Storage

__all__ = ["KEEP_PAIRS", "OutcomeCounts", "RedisShadowStore", "ShadowStore", "SqliteShadowStore",
           "open_shadow_store"]


async def open_shadow_store(storage: Storage) -> ShadowStore:
    if storage.backend is Backend.REDIS:
        return RedisShadowStore(storage.redis_client())
    return await SqliteShadowStore.open(storage.sqlite_worker())
