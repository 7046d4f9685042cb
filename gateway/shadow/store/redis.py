"""Shadow pairs and counters in Redis, shared by every replica, on the process's one Redis pool."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.shadow.compare import PairRecord
from gateway.shadow.store.base import KEEP_PAIRS, OutcomeCounts, TenantResults, decode_pair, encode_pair

if TYPE_CHECKING:
    import redis.asyncio as aioredis

REDIS_PREFIX = "kvgate:shadow"


class RedisShadowStore:
    """A capped list of pairs and a hash of counters per tenant."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client

    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            for tenant in {pair.tenant for pair in pairs}:
                key = f"{REDIS_PREFIX}:pairs:{tenant}"
                pipe.lpush(key, *[encode_pair(pair) for pair in pairs if pair.tenant == tenant])
                pipe.ltrim(key, 0, KEEP_PAIRS - 1)
            for (tenant, outcome), n in counts.items():
                pipe.hincrby(f"{REDIS_PREFIX}:counts:{tenant}", outcome, n)
            await pipe.execute()

    async def results(self, tenant: str) -> TenantResults:
        async with self._redis.pipeline(transaction=True) as pipe:  # MULTI: a write lands before or after both
            pipe.lrange(f"{REDIS_PREFIX}:pairs:{tenant}", 0, KEEP_PAIRS - 1)
            pipe.hgetall(f"{REDIS_PREFIX}:counts:{tenant}")
            raw_pairs, raw_counts = await pipe.execute()
        return TenantResults([decode_pair(item) for item in raw_pairs],
                             {key.decode(): int(value) for key, value in raw_counts.items()})

    async def close(self) -> None:
        return None  # the client belongs to the process's Storage
