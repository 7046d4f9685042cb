"""Request slots: a global in-flight cap and each tenant's `limits` (in flight, per minute).

In-flight counts are per gateway process (they track this process's open requests); per-minute limits
are shared by all replicas when Redis is configured (gateway/limits/rate.py).
"""

from __future__ import annotations

import math

from gateway.errors import Overloaded, TooManyRequests
from gateway.limits.rate import RateLimiter
from gateway.metrics import GatewayMetrics
from gateway.policy.model import TenantPolicy

GLOBAL_LABEL = "_all"  # tenant label of global refusals: made before the key is known; no tenant starts with '_'
GLOBAL_RETRY_AFTER_S = 1


def retry_after_header(seconds: float) -> int:
    """Whole seconds for Retry-After, never 0 (a client told 0 would retry at once)."""
    return max(1, math.ceil(seconds))


class InFlight:
    """Counts of open requests by key, with a cap checked on entry."""

    def __init__(self) -> None:
        self._open: dict[str, int] = {}

    def try_enter(self, key: str, cap: int | None) -> bool:
        count = self._open.get(key, 0)
        if cap is not None and count >= cap:
            return False
        self._open[key] = count + 1
        return True

    def leave(self, key: str) -> None:
        count = self._open[key] - 1
        if count:
            self._open[key] = count
        else:
            del self._open[key]

    def count(self, key: str) -> int:
        return self._open.get(key, 0)


class RequestLimits:
    def __init__(self, max_in_flight: int, rate: RateLimiter, metrics: GatewayMetrics) -> None:
        self.max_in_flight = max_in_flight
        self.rate = rate
        self.metrics = metrics
        self.in_flight = InFlight()
        self._global = GlobalSlot(self)  # holds no state of its own: one serves every request

    def global_slot(self) -> GlobalSlot:
        """`async with`: hold one of the process-wide request slots, or answer 503."""
        return self._global

    def tenant_slot(self, tenant: TenantPolicy) -> TenantSlot:
        """`async with`: hold one of the tenant's in-flight slots and one request of its per-minute budget, or
        answer 429."""
        return TenantSlot(self, tenant)

    def enter_global(self) -> None:
        if not self.in_flight.try_enter(GLOBAL_LABEL, self.max_in_flight):
            self.metrics.rate_limited.labels(GLOBAL_LABEL, "global_in_flight").inc()
            raise Overloaded("The gateway is serving too many requests; retry shortly.",
                             retry_after_s=GLOBAL_RETRY_AFTER_S)

    async def enter_tenant(self, tenant: TenantPolicy) -> None:
        name, limits = tenant.tenant, tenant.limits
        if not self.in_flight.try_enter(name, limits.max_in_flight):
            self._refused(name, "max_in_flight")
            raise TooManyRequests(f"Tenant {name!r} has {limits.max_in_flight} requests in flight, its limit.",
                                  retry_after_s=1)
        if limits.requests_per_minute is None:
            return
        try:
            wait_s = await self.rate.acquire(name, limits.requests_per_minute)
        except BaseException:
            self.in_flight.leave(name)
            raise
        if wait_s is not None:
            self.in_flight.leave(name)
            self._refused(name, "requests_per_minute")
            raise TooManyRequests(
                f"Tenant {name!r} is over its limit of {limits.requests_per_minute} requests per minute.",
                retry_after_s=retry_after_header(wait_s))

    def _refused(self, tenant: str, limit: str) -> None:
        self.metrics.rate_limited.labels(tenant, limit).inc()


# Context managers as small classes, not @asynccontextmanager generators: two are entered per request, and a
# generator-based one costs several more calls each (loadtests/instructions.py).


class GlobalSlot:
    __slots__ = ("limits",)

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits

    async def __aenter__(self) -> None:
        self.limits.enter_global()

    async def __aexit__(self, *exc_info: object) -> None:
        self.limits.in_flight.leave(GLOBAL_LABEL)


class TenantSlot:
    __slots__ = ("limits", "tenant")

    def __init__(self, limits: RequestLimits, tenant: TenantPolicy) -> None:
        self.limits = limits
        self.tenant = tenant

    async def __aenter__(self) -> None:
        await self.limits.enter_tenant(self.tenant)

    async def __aexit__(self, *exc_info: object) -> None:
        self.limits.in_flight.leave(self.tenant.tenant)
