"""Offload admission as the request path runs it: the sketch's arithmetic (row offsets, generations, the
decision boundary, width checks), one process's local doorkeepers, two replicas sharing counts through a real
redis-server, and the local decision (flagged) when Redis does not answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.policy.model import AdmissionPolicy
from gateway.reuse.admission import (
    DEPTH,
    AdmissionResult,
    AdmissionRule,
    Doorkeeper,
    decide,
    generation,
    prompt_key,
    row_offsets,
)
from gateway.reuse.fingerprint import tenant_trace_key
from gateway.reuse.shared import KEY_PREFIX, Admission, rule_of
from gateway.storage import Storage
from tests.ledger.redis_proc import RedisProcess
from tests.procs import free_port

SECRET = b"unit-secret-of-at-least-32-bytes!!"
RETURNING = AdmissionRule("returning", window_s=3600.0, min_seen=1, prefix_chunks=1)
PROMPT = list(range(1000, 1064))  # one whole 64-token chunk


@pytest.mark.parametrize(("width", "offsets"), [
    # key bytes 00 01 02 .. 07 read little-endian: 0x0706050403020100, 16 bits per row
    (65536, (0x0100, 65536 + 0x0302, 2 * 65536 + 0x0504, 3 * 65536 + 0x0706)),
    (16, (0, 16 + 2, 32 + 4, 48 + 6)),
    (1, (0, 1, 2, 3)),
])
def test_row_offsets_slice_the_key_into_one_counter_per_row(width: int, offsets: tuple[int, ...]) -> None:
    assert row_offsets(bytes(range(8)) + b"ignored", width) == offsets


@pytest.mark.parametrize(("now", "window", "number"), [
    (0.0, 100.0, 0), (49.999, 100.0, 0), (50.0, 100.0, 1), (149.0, 100.0, 2), (1.7e9, 3600.0, 944_444),
])
def test_generations_are_half_windows_of_the_wall_clock(now: float, window: float, number: int) -> None:
    assert generation(now, window) == number


@pytest.mark.parametrize(("seen", "min_seen", "decision"), [(0, 1, "new"), (1, 1, "returning"), (2, 3, "new"),
                                                           (3, 3, "returning"), (255, 254, "returning")])
def test_a_prefix_is_returning_once_seen_min_seen_times(seen: int, min_seen: int, decision: str) -> None:
    assert decide(seen, AdmissionRule("returning", 60.0, min_seen, 1)) == decision


@pytest.mark.parametrize("width", [0, 3, 100, 65537, -2])
def test_a_sketch_width_must_be_a_power_of_two_up_to_65536(width: int) -> None:
    with pytest.raises(ValueError, match="power of two"):
        Doorkeeper(width)


@pytest.mark.parametrize("width", [1, 2, 1024, 65536])
def test_a_sketch_holds_two_generations_of_depth_rows(width: int) -> None:
    assert Doorkeeper(width).memory_bytes == 2 * DEPTH * width


def test_a_window_change_starts_the_counts_afresh() -> None:
    keeper = Doorkeeper(16)
    key = bytes(range(8))
    assert [keeper.observe(key, 10.0, 100.0) for _ in range(3)] == [0, 1, 2]
    assert keeper.observe(key, 10.0, 200.0) == 0  # a reloaded policy with another window


def test_the_policy_becomes_the_rule() -> None:
    assert rule_of(AdmissionPolicy(mode="returning", window_s=60, min_seen=2, prefix_chunks=3)) == AdmissionRule(
        "returning", 60.0, 2, 3)
    assert rule_of(AdmissionPolicy()) == AdmissionRule()


def test_local_admission_counts_per_tenant_and_refuses_prompts_without_a_chunk() -> None:
    async def run() -> None:
        admission = Admission(SECRET, width=16)
        key = admission.key_for("acme", PROMPT, 1)
        assert key is not None and admission.key_for("acme", PROMPT, 1) == key
        assert admission.key_for("beta", PROMPT, 1) != key  # keyed per tenant
        assert admission.key_for("acme", None, 1) is None
        assert await admission.admit("acme", key, RETURNING) == (AdmissionResult("new", 0), False)
        assert await admission.admit("acme", key, RETURNING) == (AdmissionResult("returning", 1), False)
        assert await admission.admit("beta", key, RETURNING) == (AdmissionResult("new", 0), False)
        assert await admission.admit("acme", None, RETURNING) == (AdmissionResult("short", 0), False)
        assert admission.memory_bytes() == 2 * (2 * DEPTH * 16)  # one sketch per tenant seen

    asyncio.run(run())


@pytest.mark.parametrize("prompt", [
    list(range(63)), list(range(64)), list(range(65)), "x" * 255, "x" * 256, "é" * 255, "é" * 256, [], "",
])
@pytest.mark.parametrize("prefix_chunks", [1, 4])
def test_a_prompt_is_short_exactly_when_its_key_has_no_chunk(prompt: str | list[int], prefix_chunks: int) -> None:
    admission = Admission(SECRET, width=16)
    trace_key = tenant_trace_key(SECRET, "acme")
    assert (admission.key_for("acme", prompt, prefix_chunks) is None) is (prompt_key(trace_key, prompt,
                                                                                    prefix_chunks) is None)
    if admission.key_for("acme", prompt, prefix_chunks) is not None:
        assert admission.key_for("acme", prompt, prefix_chunks) == prompt_key(trace_key, prompt, prefix_chunks)


def test_a_short_request_is_decided_without_a_sketch() -> None:
    async def run() -> None:
        admission = Admission(SECRET, width=16)
        assert await admission.admit("acme", None, RETURNING) == (AdmissionResult("short", 0), False)
        assert admission.memory_bytes() == 0  # nothing to count, so nothing was allocated for it

    asyncio.run(run())


@pytest.mark.redis
def test_replicas_count_each_others_requests_through_redis(redis_server: RedisProcess, tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(redis_server.url, tmp_path / "unused.sqlite3")
        client = storage.redis_client()
        tenant = f"t{free_port()}"  # a tenant of its own: order-independent
        one, other = Admission.on(storage, SECRET, width=1024), Admission.on(storage, SECRET, width=1024)
        key = one.key_for(tenant, PROMPT, 1)
        assert await one.admit(tenant, key, RETURNING) == (AdmissionResult("new", 0), False)
        assert await other.admit(tenant, key, RETURNING) == (AdmissionResult("returning", 1), False)
        assert await one.admit(tenant, key, RETURNING) == (AdmissionResult("returning", 2), False)
        keys = sorted(await client.keys(f"{KEY_PREFIX}:{tenant}:*"))
        assert len(keys) == 1 and keys[0].decode().startswith(f"{KEY_PREFIX}:{tenant}:3600:")
        assert 0 < await client.ttl(keys[0]) <= 3601  # a generation lives one window
        assert len(await client.get(keys[0]) or b"") <= DEPTH * 1024  # the sketch is bounded in Redis too
        await storage.close()

    asyncio.run(run())


def test_when_redis_does_not_answer_the_local_sketch_decides_and_says_so() -> None:
    async def run() -> None:
        client = aioredis.Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
        admission = Admission(SECRET, client, width=16)
        key = admission.key_for("acme", PROMPT, 1)
        assert await admission.admit("acme", key, RETURNING) == (AdmissionResult("new", 0), True)
        assert await admission.admit("acme", key, RETURNING) == (AdmissionResult("returning", 1), True)
        assert await admission.admit("acme", None, RETURNING) == (AdmissionResult("short", 0), False)
        await client.aclose()

    asyncio.run(run())
