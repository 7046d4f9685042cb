"""Requests-per-minute limits: the generic cell-rate algorithm (GCRA), kept in memory or in Redis.

GCRA keeps one number per tenant, the theoretical arrival time (TAT). A limit of R requests per minute
admits a burst of R requests and then one every 60/R seconds, so it behaves like a token bucket of R
tokens refilled at R per minute, without a timer. With Redis the same arithmetic runs in one Lua script
using the Redis server's clock, so every replica shares one bucket per tenant and replicas' clocks may
differ.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.log import get_logger
from gateway.storage import Backend, Storage, errors_with_redis

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = get_logger(__name__)
WINDOW_S = 60.0
REDIS_PREFIX = "kvgate:rate"
REDIS_TIMEOUT_S = 0.25  # a request waits at most this long for the shared limiter before the local one answers

# KEYS[1] = the tenant's TAT key; ARGV = emission interval, burst tolerance (seconds).
# Returns "" when admitted, else the seconds until a request would be admitted.
GCRA_LUA = """
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local interval = tonumber(ARGV[1])
local tolerance = tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if tat - now > tolerance then
  return tostring(tat - tolerance - now)
end
tat = tat + interval
redis.call('SET', KEYS[1], tostring(tat), 'PX', math.ceil((tat - now) * 1000) + 1000)
return ''
"""


def gcra_parameters(per_minute: int) -> tuple[float, float]:
    """(emission interval, burst tolerance) in seconds for `per_minute` requests per minute."""
    interval = WINDOW_S / per_minute
    return interval, WINDOW_S - interval


class RateLimiter(Protocol):
    async def acquire(self, tenant: str, per_minute: int) -> float | None:
        """None when the request is admitted, else the seconds after which one would be."""
        ...


class LocalRateLimiter:
    """GCRA in process memory: one float per tenant (tenants come from the policy set, so it is bounded)."""

    def __init__(self) -> None:
        self._tat: dict[str, float] = {}

    async def acquire(self, tenant: str, per_minute: int) -> float | None:
        return self.acquire_now(tenant, per_minute, time.monotonic())

    def acquire_now(self, tenant: str, per_minute: int, now: float) -> float | None:
        interval, tolerance = gcra_parameters(per_minute)
        tat = max(self._tat.get(tenant, now), now)
        if tat - now > tolerance:
            return tat - tolerance - now
        self._tat[tenant] = tat + interval
        return None


class RedisRateLimiter:
    """GCRA shared by every replica through Redis; the local limiter answers while Redis is unreachable."""

    def __init__(self, client: aioredis.Redis, fallback: LocalRateLimiter, on_fallback: Callable[[], None],
                 timeout_s: float = REDIS_TIMEOUT_S) -> None:
        self._script = client.register_script(GCRA_LUA)
        self._timeout_s = timeout_s
        self._fallback = fallback
        self._on_fallback = on_fallback  # counts requests the local limiter judged because Redis did not answer
        self._down = False

    async def acquire(self, tenant: str, per_minute: int) -> float | None:
        interval, tolerance = gcra_parameters(per_minute)
        try:
            async with asyncio.timeout(self._timeout_s):
                answer = await self._script(keys=[f"{REDIS_PREFIX}:{tenant}"], args=[interval, tolerance])
        except errors_with_redis(OSError, TimeoutError) as error:
            self._on_fallback()
            if not self._down:
                self._down = True
                log.warning("rate_limit_store_unavailable", error=type(error).__name__)
            return await self._fallback.acquire(tenant, per_minute)
        if self._down:
            self._down = False
            log.info("rate_limit_store_recovered")
        text = answer.decode() if isinstance(answer, bytes) else str(answer)
        return float(text) if text else None


def open_rate_limiter(storage: Storage, on_fallback: Callable[[], None]) -> RateLimiter:
    """Shared through the process's Redis pool when the gateway stores state in Redis, else in memory."""
    local = LocalRateLimiter()
    if storage.backend is Backend.REDIS:
        return RedisRateLimiter(storage.redis_client(), local, on_fallback)
    return local
