"""Request limits called directly: the GCRA arithmetic (parameters, burst, refill, waits, a property bounding what
any arrival pattern can get through), Retry-After rounding, in-flight counting, the slots' refusals with their
status, headers and metric, and the shared limiter on a real redis-server (shared bucket, fallback when away)."""

from __future__ import annotations

import asyncio
import math
import signal
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.errors import Overloaded, TooManyRequests
from gateway.limits.rate import (
    REDIS_PREFIX,
    LocalRateLimiter,
    RedisRateLimiter,
    gcra_parameters,
    open_rate_limiter,
)
from gateway.limits.slots import GLOBAL_LABEL, InFlight, RequestLimits, retry_after_header
from gateway.metrics import GatewayMetrics
from gateway.policy.model import TenantLimits, TenantPolicy
from gateway.storage import Storage
from tests.ledger.redis_proc import RedisProcess
from tests.procs import free_port


@pytest.mark.parametrize(("per_minute", "interval", "tolerance"), [
    (1, 60.0, 0.0),
    (2, 30.0, 30.0),
    (60, 1.0, 59.0),
    (600, 0.1, 59.9),
    (7, 60 / 7, 60 - 60 / 7),
    (60_000, 0.001, 59.999),
])
def test_gcra_parameters(per_minute: int, interval: float, tolerance: float) -> None:
    assert gcra_parameters(per_minute) == pytest.approx((interval, tolerance))


def admitted(limiter: LocalRateLimiter, per_minute: int, times: list[float], tenant: str = "t") -> list[bool]:
    return [limiter.acquire_now(tenant, per_minute, now) is None for now in times]


@pytest.mark.parametrize("per_minute", [1, 2, 5, 60])
def test_a_burst_of_exactly_the_budget_is_admitted_at_one_instant(per_minute: int) -> None:
    assert admitted(LocalRateLimiter(), per_minute, [100.0] * (per_minute + 2)) == [True] * per_minute + [False] * 2


def test_one_per_minute_admits_one_then_waits_the_whole_minute() -> None:
    limiter = LocalRateLimiter()
    assert limiter.acquire_now("t", 1, 0.0) is None
    assert limiter.acquire_now("t", 1, 0.0) == pytest.approx(60.0)
    assert limiter.acquire_now("t", 1, 59.5) == pytest.approx(0.5)
    assert limiter.acquire_now("t", 1, 60.0) is None


def test_the_wait_is_the_time_until_the_next_admission() -> None:
    limiter = LocalRateLimiter()
    admitted(limiter, 6, [0.0] * 6)  # the budget of 6, one per 10 s after it
    for now, wait in [(0.0, 10.0), (2.5, 7.5), (9.0, 1.0)]:
        assert limiter.acquire_now("t", 6, now) == pytest.approx(wait)
    assert limiter.acquire_now("t", 6, 10.0) is None
    assert limiter.acquire_now("t", 6, 10.0) == pytest.approx(10.0)  # the refill was used at once


def test_refusals_do_not_use_up_budget() -> None:
    limiter = LocalRateLimiter()
    admitted(limiter, 2, [0.0, 0.0])
    assert admitted(limiter, 2, [1.0] * 50) == [False] * 50
    assert admitted(limiter, 2, [30.0, 30.0]) == [True, False]


def test_an_idle_tenant_refills_to_the_budget_never_beyond() -> None:
    limiter = LocalRateLimiter()
    admitted(limiter, 3, [0.0, 0.0, 0.0])
    assert admitted(limiter, 3, [10_000.0] * 5) == [True, True, True, False, False]


def test_requests_at_exactly_the_emission_interval_are_all_admitted() -> None:
    assert all(admitted(LocalRateLimiter(), 4, [15.0 * n for n in range(100)]))


def test_tenants_have_buckets_of_their_own() -> None:
    limiter = LocalRateLimiter()
    assert admitted(limiter, 1, [0.0, 0.0], tenant="a") == [True, False]
    assert admitted(limiter, 1, [0.0, 0.0], tenant="b") == [True, False]


def test_a_raised_limit_carries_the_used_minute_over() -> None:
    limiter = LocalRateLimiter()
    admitted(limiter, 2, [0.0, 0.0])  # the minute is used up: TAT = 60 s
    assert limiter.acquire_now("t", 2, 0.0) == pytest.approx(30.0)
    assert limiter.acquire_now("t", 120, 0.0) == pytest.approx(0.5)  # after a reload: tolerance 59.5 s, same TAT
    assert admitted(limiter, 120, [0.5, 0.5]) == [True, False]


@settings(max_examples=50, deadline=None)
@given(per_minute=st.integers(1, 30), gaps=st.lists(st.floats(0, 20), min_size=1, max_size=80))
def test_no_arrival_pattern_gets_more_than_the_budget_plus_the_refill(per_minute: int, gaps: list[float]) -> None:
    limiter = LocalRateLimiter()
    now, results = 0.0, []
    for gap in gaps:
        now += gap
        results.append(limiter.acquire_now("t", per_minute, now))
    assert sum(result is None for result in results) <= per_minute + math.floor(now * per_minute / 60 + 1e-9)
    assert all(wait is None or 0 < wait <= 60 / per_minute + 1e-9 for wait in results)
    assert results[0] is None  # a fresh tenant is always admitted


@pytest.mark.parametrize(("seconds", "header"), [
    (0.0, 1), (1e-9, 1), (0.5, 1), (1.0, 1), (1.000001, 2), (2.5, 3), (59.99, 60), (60.0, 60),
])
def test_retry_after_is_whole_seconds_rounded_up_and_never_zero(seconds: float, header: int) -> None:
    assert retry_after_header(seconds) == header


def test_in_flight_counts_per_key_against_its_cap() -> None:
    slots = InFlight()
    assert [slots.try_enter("a", 2) for _ in range(3)] == [True, True, False]
    assert slots.try_enter("b", 1) and slots.count("b") == 1
    assert slots.count("a") == 2 and slots.count("never") == 0
    slots.leave("a")
    assert slots.try_enter("a", 2)


@pytest.mark.parametrize(("cap", "entered"), [(None, 100), (0, 0), (1, 1), (5, 5)])
def test_a_cap_admits_exactly_that_many(cap: int | None, entered: int) -> None:
    slots = InFlight()
    assert sum(slots.try_enter("k", cap) for _ in range(100)) == entered


def test_leaving_the_last_slot_forgets_the_key_and_an_unknown_leave_is_an_error() -> None:
    slots = InFlight()
    slots.try_enter("k", None)
    slots.leave("k")
    assert slots.count("k") == 0 and slots._open == {}  # bounded: no zero entries left behind
    with pytest.raises(KeyError):
        slots.leave("k")


# --- the slots as the request pipeline uses them -----------------------------------------------------------------


def tenant(name: str = "acme", max_in_flight: int | None = None, per_minute: int | None = None) -> TenantPolicy:
    return TenantPolicy(tenant=name, limits=TenantLimits(max_in_flight=max_in_flight, requests_per_minute=per_minute))


def refused(metrics: GatewayMetrics, tenant_name: str, limit: str) -> float:
    value = metrics.registry.get_sample_value("kvgate_rate_limited_total", {"tenant": tenant_name, "limit": limit})
    return value or 0.0


def limits(max_in_flight: int = 2) -> RequestLimits:
    return RequestLimits(max_in_flight, LocalRateLimiter(), GatewayMetrics(CollectorRegistry()))


def test_the_global_slot_answers_503_with_retry_after_when_full_and_counts_it() -> None:
    async def run() -> None:
        gate = limits(max_in_flight=1)
        async with gate.global_slot():
            with pytest.raises(Overloaded) as raised:
                async with gate.global_slot():
                    pytest.fail("a second request got a slot")
            assert (raised.value.status_code, raised.value.headers()) == (503, [(b"retry-after", b"1")])
        async with gate.global_slot():  # released on exit
            assert gate.in_flight.count(GLOBAL_LABEL) == 1
        assert refused(gate.metrics, GLOBAL_LABEL, "global_in_flight") == 1

    asyncio.run(run())


def test_a_tenant_slot_is_released_when_the_request_fails() -> None:
    async def run() -> None:
        gate = limits()
        policy = tenant(max_in_flight=1)
        with pytest.raises(RuntimeError):
            async with gate.tenant_slot(policy):
                raise RuntimeError("upstream broke")
        assert gate.in_flight.count("acme") == 0
        async with gate.tenant_slot(policy):
            with pytest.raises(TooManyRequests) as raised:
                async with gate.tenant_slot(policy):
                    pytest.fail("over max_in_flight")
        assert raised.value.message == "Tenant 'acme' has 1 requests in flight, its limit."
        assert (raised.value.status_code, raised.value.code) == (429, "rate_limit_exceeded")
        assert refused(gate.metrics, "acme", "max_in_flight") == 1
        assert refused(gate.metrics, "acme", "requests_per_minute") == 0

    asyncio.run(run())


def test_the_per_minute_budget_answers_429_with_a_retry_after_and_frees_the_in_flight_slot() -> None:
    async def run() -> None:
        gate = limits()
        policy = tenant(per_minute=1, max_in_flight=5)
        async with gate.tenant_slot(policy):
            pass
        with pytest.raises(TooManyRequests) as raised:
            async with gate.tenant_slot(policy):
                pytest.fail("over requests_per_minute")
        assert raised.value.message == "Tenant 'acme' is over its limit of 1 requests per minute."
        assert 1 <= raised.value.retry_after_s <= 60
        assert gate.in_flight.count("acme") == 0
        assert refused(gate.metrics, "acme", "requests_per_minute") == 1
        async with gate.tenant_slot(tenant("other", per_minute=1)):  # another tenant's budget is untouched
            pass

    asyncio.run(run())


def test_a_tenant_without_limits_is_never_refused() -> None:
    async def run() -> None:
        gate = limits()
        for _ in range(200):
            async with gate.tenant_slot(tenant()):
                pass
        assert refused(gate.metrics, "acme", "max_in_flight") == refused(gate.metrics, "acme",
                                                                         "requests_per_minute") == 0

    asyncio.run(run())


# --- shared through Redis --------------------------------------------------------------------------------------


@pytest.mark.redis
def test_replicas_share_one_bucket_through_redis(redis_server: RedisProcess) -> None:
    async def run() -> None:
        fallbacks: list[int] = []
        client = aioredis.Redis.from_url(redis_server.url)
        await client.delete(f"{REDIS_PREFIX}:shared")
        # A generous timeout: this test is about one shared bucket, and a loaded machine may take longer than
        # the production 0.25 s for the first call (connection and script load); that fallback has its own test.
        one = RedisRateLimiter(client, LocalRateLimiter(), lambda: fallbacks.append(1), timeout_s=30.0)
        other = RedisRateLimiter(client, LocalRateLimiter(), lambda: fallbacks.append(1), timeout_s=30.0)
        answers = [await limiter.acquire("shared", 3) for limiter in (one, other, one, other)]
        assert answers[:3] == [None, None, None]
        assert answers[3] is not None and 0 < answers[3] <= 20.0
        ttl_ms = await client.pttl(f"{REDIS_PREFIX}:shared")
        assert 0 < ttl_ms <= 61_000  # the key expires once the bucket would be full again
        assert fallbacks == []
        await client.delete(f"{REDIS_PREFIX}:shared")
        await client.aclose()

    asyncio.run(run())


def test_the_local_limiter_answers_and_counts_while_redis_is_away() -> None:
    async def run() -> None:
        fallbacks: list[int] = []
        client = aioredis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))  # nothing there
        limiter = RedisRateLimiter(client, LocalRateLimiter(), lambda: fallbacks.append(1))
        assert [await limiter.acquire("t", 2) is None for _ in range(3)] == [True, True, False]
        assert len(fallbacks) == 3  # every decision made locally is counted
        await client.aclose()

    asyncio.run(run())


def test_the_limiter_follows_the_storage_backend(tmp_path: Path) -> None:
    async def run() -> None:
        sqlite = await Storage.open(None, tmp_path / "state.sqlite3")
        assert isinstance(open_rate_limiter(sqlite, lambda: None), LocalRateLimiter)
        await sqlite.close()
        redis = await Storage.open(f"redis://127.0.0.1:{free_port()}/0", tmp_path / "unused.sqlite3")
        assert isinstance(open_rate_limiter(redis, lambda: None), RedisRateLimiter)
        await redis.close()

    asyncio.run(run())


@pytest.mark.redis
def test_a_request_cancelled_while_its_rate_decision_waits_gives_its_slot_back(tmp_path: Path) -> None:
    """The client goes away while Redis (stopped with SIGSTOP) holds the per-minute decision: the in-flight slot
    the request took must be free again, or the tenant loses one of its slots for good."""
    server = RedisProcess(tmp_path / "redis").start()
    assert server.popen is not None
    try:
        async def run() -> tuple[int, int]:
            client = aioredis.Redis.from_url(server.url)
            gate = RequestLimits(2, RedisRateLimiter(client, LocalRateLimiter(), lambda: None, timeout_s=60.0),
                                 GatewayMetrics(CollectorRegistry()))
            policy = tenant(max_in_flight=1, per_minute=100)

            async def request() -> None:
                async with gate.tenant_slot(policy):
                    pytest.fail("the decision cannot arrive while Redis is stopped")

            server.popen.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
            task = asyncio.get_running_loop().create_task(request())
            while gate.in_flight.count("acme") == 0:  # the slot is taken before the decision is asked for
                await asyncio.sleep(0)
            held = gate.in_flight.count("acme")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            server.popen.send_signal(signal.SIGCONT)  # type: ignore[union-attr]
            await client.aclose()
            return held, gate.in_flight.count("acme")

        assert asyncio.run(run()) == (1, 0)
    finally:
        server.popen.send_signal(signal.SIGCONT)
        server.stop()
