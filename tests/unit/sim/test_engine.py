"""The simulated engine, in-process: prefix hits, output blocks, the TTFT model, gauges and counters, resets,
cancellation, the CPU tier (replaying the captured vLLM 0.25.0 transfer-parameter steps), load failures and LMCache.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine, LoadFailed
from gateway.sim.protocol import Kind
from gateway.sim.state import SimState
from tests.unit.sim.captures import transfer_steps
from tests.unit.sim.engine_kit import request, samples, serve, settings, tokens

BYTES_PER_TOKEN = 147456
LABELS = {"model_name": "sim-model", "engine": "0"}


def build(**overrides: Any) -> tuple[SimConfig, Engine]:
    config = settings(**overrides)
    return config, SimState.build(config).engine


def metric(engine: Engine, name: str, **labels: str) -> float:
    value = engine.metrics.registry.get_sample_value(name, {**LABELS, **labels})
    return 0.0 if value is None else value


async def hits(engine: Engine, config: SimConfig, prompt: list[int], **body: Any) -> tuple[int, int]:
    run = await serve(engine, request(config, prompt, **body))
    return run.gpu_hit, run.loaded


@pytest.mark.parametrize(
    ("length", "repeat_hit"),
    [(1, 0), (16, 0), (17, 16), (31, 16), (32, 16), (33, 32), (64, 48), (1000, 992)],
)
def test_a_repeated_prompt_hits_all_full_blocks_but_never_its_last_token(length: int, repeat_hit: int) -> None:
    config, engine = build()
    prompt = tokens(length, 1000)
    assert asyncio.run(hits(engine, config, prompt)) == (0, 0)
    assert asyncio.run(hits(engine, config, prompt)) == (repeat_hit, 0)


def test_a_longer_prompt_hits_the_shared_prefix() -> None:
    config, engine = build()

    async def scenario() -> list[int]:
        base = tokens(100, 1000)
        first = await serve(engine, request(config, base))
        longer = await serve(engine, request(config, base + tokens(50, 5000)))
        diverged = await serve(engine, request(config, base[:40] + tokens(60, 7000)))
        return [first.gpu_hit, longer.gpu_hit, diverged.gpu_hit]

    assert asyncio.run(scenario()) == [0, 96, 32]


def test_salts_isolate_and_the_unsalted_chain_is_its_own() -> None:
    config, engine = build()

    async def scenario() -> list[int]:
        prompt = tokens(320, 1000)
        order = [None, "a", "b", "a", None, "b"]
        return [(await serve(engine, request(config, prompt, cache_salt=s))).gpu_hit
                for s in order]

    assert asyncio.run(scenario()) == [0, 0, 0, 304, 304, 304]


def test_the_blocks_generated_tokens_fill_are_cached_for_the_next_turn() -> None:
    """50 prompt tokens + 40 generated: 89 tokens have KV (the last generated one never does) = 5 full blocks."""
    config, engine = build()

    async def scenario() -> tuple[int, int]:
        prompt = tokens(50, 1000)
        output = tokens(40, 9000)
        await serve(engine, request(config, prompt), output)
        follow_up = await serve(engine, request(config, prompt + output + tokens(30, 12000)))
        short = await serve(engine, request(config, prompt + output[:30]))  # 80 tokens: 79 can hit, 4 blocks
        return follow_up.gpu_hit, short.gpu_hit

    assert asyncio.run(scenario()) == (80, 64)


def test_an_output_that_fills_no_block_caches_nothing_more() -> None:
    config, engine = build()

    async def scenario() -> int:
        prompt = tokens(30, 1000)
        await serve(engine, request(config, prompt), tokens(2, 9000))  # 31 tokens with KV: still one block
        return engine.cache.cached_blocks

    assert asyncio.run(scenario()) == 1


@pytest.mark.parametrize(
    ("overrides", "second_prefill_s"),
    [
        # 5 ms + 8 computed x 40 us + 992 GPU-hit x 1 us, for the repeat of a 1000-token prompt
        ({}, 0.005 + (8 * 40 + 992 * 1) / 1e6),
        ({"base_ttft_ms": 0.0, "cached_us_per_token": 0.0}, 8 * 40 / 1e6),
        ({"base_ttft_ms": 1.0, "prefill_us_per_token": 0.0, "cached_us_per_token": 2.0}, 0.001 + 992 * 2 / 1e6),
    ],
)
def test_the_ttft_model(overrides: dict[str, float], second_prefill_s: float) -> None:
    defaults = {"base_ttft_ms": 5.0, "prefill_us_per_token": 40.0, "cached_us_per_token": 1.0}
    config, engine = build(**{**defaults, **overrides})
    prompt = tokens(1000, 1000)
    first = asyncio.run(serve(engine, request(config, prompt)))
    second = asyncio.run(serve(engine, request(config, prompt)))
    cold = config.base_ttft_ms / 1e3 + 1000 * config.prefill_us_per_token / 1e6
    assert first.prefill_s == pytest.approx(cold)
    assert second.prefill_s == pytest.approx(second_prefill_s)


def test_prefill_counters_split_the_prompt_by_source() -> None:
    config, engine = build()
    prompt = tokens(100, 1000)
    asyncio.run(serve(engine, request(config, prompt, max_tokens=7), tokens(7, 9000)))
    asyncio.run(serve(engine, request(config, prompt), tokens(1, 9000)))
    assert metric(engine, "vllm:prompt_tokens_total") == 200
    assert metric(engine, "vllm:prefix_cache_queries_total") == 200
    assert metric(engine, "vllm:prefix_cache_hits_total") == 96
    assert metric(engine, "vllm:prompt_tokens_by_source_total", source="local_compute") == 104
    assert metric(engine, "vllm:prompt_tokens_by_source_total", source="local_cache_hit") == 96
    assert metric(engine, "vllm:prompt_tokens_cached_by_source_total", source="device") == 96
    assert metric(engine, "vllm:prompt_tokens_cached_total") == 96
    assert metric(engine, "vllm:external_prefix_cache_queries_total") == 0  # no connector: not asked
    assert metric(engine, "vllm:generation_tokens_total") == 8
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 2
    assert metric(engine, "vllm:request_params_max_tokens_sum") == 8
    assert metric(engine, "vllm:request_prefill_kv_computed_tokens_sum") == 104
    assert metric(engine, "vllm:time_to_first_token_seconds_count") == 2


def test_gauges_follow_a_request_through_the_engine() -> None:
    config, engine = build(gpu_blocks=10)

    async def scenario() -> list[tuple[float, float, float]]:
        seen = []
        run = await engine.prefill(request(config, tokens(40, 1000)), time.monotonic())
        seen.append((metric(engine, "vllm:num_requests_running"), metric(engine, "vllm:num_requests_waiting"),
                     metric(engine, "vllm:kv_cache_usage_perc")))
        engine.finish(run, (), "length")
        seen.append((metric(engine, "vllm:num_requests_running"), metric(engine, "vllm:num_requests_waiting"),
                     metric(engine, "vllm:kv_cache_usage_perc")))
        return seen

    # 40 tokens: two full blocks and a partial one in use while running; nothing in use afterwards.
    assert asyncio.run(scenario()) == [(1.0, 0.0, 0.3), (0.0, 0.0, 0.0)]
    assert (engine.running, engine.waiting, engine.cache.cached_blocks) == (0, 0, 2)


def test_a_second_request_waits_while_a_prefill_holds_the_engine_and_is_aborted_when_cancelled() -> None:
    config, engine = build(base_ttft_ms=3_600_000.0)  # an hour-long prefill: only cancellation ends it

    async def scenario() -> tuple[int, int, int, int]:
        async with asyncio.TaskGroup() as group:
            first = group.create_task(engine.prefill(request(config, tokens(64, 1000)), time.monotonic()))
            second = group.create_task(engine.prefill(request(config, tokens(64, 2000)), time.monotonic()))
            deadline = time.monotonic() + 10
            while (engine.running, engine.waiting) != (1, 1):
                assert time.monotonic() < deadline, "the engine never held one request and queued the other"
                await asyncio.sleep(0.001)
            in_use = engine.cache.blocks_in_use
            first.cancel()
            while engine.running != 1 or engine.waiting != 0:  # the second now holds the engine
                assert time.monotonic() < deadline
                await asyncio.sleep(0.001)
            second.cancel()
        return in_use, engine.running, engine.cache.blocks_in_use, engine.cache.cached_blocks

    assert asyncio.run(scenario()) == (4, 0, 0, 8)  # cancelled requests release their blocks (still cached)
    assert metric(engine, "vllm:request_success_total", finished_reason="abort") == 2
    assert metric(engine, "vllm:time_to_first_token_seconds_count") == 0


def test_reset_prefix_cache_is_refused_while_a_request_holds_blocks() -> None:
    config, engine = build(offload=True)

    async def scenario() -> list[bool]:
        run = await engine.prefill(request(config, tokens(128, 1000)), time.monotonic())
        refused = engine.reset_prefix_cache(reset_external=True)
        engine.finish(run, (), "length")
        return [refused, engine.reset_prefix_cache(reset_external=False)]

    assert asyncio.run(scenario()) == [False, True]
    assert engine.offload is not None
    assert (engine.cache.cached_blocks, len(engine.offload.tier)) == (0, 2)  # the CPU tier survives
    assert engine.reset_prefix_cache(reset_external=True) is True
    assert len(engine.offload.tier) == 0


def test_a_prompt_larger_than_the_pool_leaves_its_tail_uncached() -> None:
    config, engine = build(gpu_blocks=4)
    prompt = tokens(100, 1000)  # six full blocks and a partial one
    first = asyncio.run(serve(engine, request(config, prompt)))
    assert (first.taken.held, first.taken.anonymous) == (first.hashes[:4], 0)
    assert asyncio.run(serve(engine, request(config, prompt))).gpu_hit == 64


# --- the CPU tier, replayed against the captured vLLM 0.25.0 run -------------------------------------------

COMPARED = ("vllm:external_prefix_cache_hits_total", "vllm:external_prefix_cache_queries_total",
            "vllm:kv_offload_load_bytes_total", "vllm:kv_offload_load_size_count", "vllm:kv_offload_load_size_sum",
            "vllm:kv_offload_size_count", "vllm:kv_offload_size_sum", "vllm:kv_offload_store_bytes_total",
            "vllm:kv_offload_store_size_count", "vllm:kv_offload_store_size_sum", "vllm:kv_offload_total_bytes_total",
            "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_by_source_total",
            "vllm:prompt_tokens_cached_total", "vllm:prompt_tokens_total")
"""Every family of steps.json's deltas except the transfer times (wall-clock, not modelled exactly)."""


def _prompt_of(step: str, prompts: dict[str, list[int]], plen: int) -> list[int]:
    """Steps name their prompt by a letter (A, B, B2, C); each pressure step is a fresh prompt."""
    label = step.split()[1] if "pressure" not in step else step
    if label not in prompts:  # a distinct first token makes every block of the chain distinct
        prompts[label] = [259 + len(prompts)] + [300 + i % 30000 for i in range(plen - 1)]
    return prompts[label]


async def _replay_steps(config: SimConfig) -> list[tuple[str, int, dict[str, float]]]:
    state = SimState.build(config)
    captured = transfer_steps()
    prompts: dict[str, list[int]] = {}
    seen = []
    for step in captured["steps"]:
        before = samples(state, COMPARED)
        body = {"cache_salt": step["salt"]}
        if step["kv_transfer_params"] is not None:
            body["kv_transfer_params"] = step["kv_transfer_params"]
        prompt = _prompt_of(step["step"], prompts, captured["plen"])
        run = await serve(state.engine, request(config, prompt, **body))
        after = samples(state, COMPARED)
        delta = {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
        seen.append((step["step"], run.cached_tokens, delta))
    return seen


def test_the_cpu_tier_reproduces_the_captured_vllm_0_25_0_steps() -> None:
    """Same 8000-token prompts, salts and caps as the H200 run; GPU pressure from a 1000-block pool. Every step's
    cached tokens and every counter delta (bytes, transfers, queries, hits, tokens by source) must match."""
    config = settings(model="m", offload=True, gpu_blocks=1000, ignore_max_load_tokens=True)
    replayed = asyncio.run(_replay_steps(config))
    for (name, cached, delta), step in zip(replayed, transfer_steps()["steps"], strict=True):
        expected = {k: v for k, v in step["delta"].items() if k.split("{")[0] in COMPARED}
        assert (name, cached, delta) == (step["step"], step["cached_tokens"], expected)


def test_under_vllm_0_33_rules_max_load_tokens_caps_the_load() -> None:
    """The two steps 0.25.0 ignored: max_load_tokens 0 loads nothing, 2048 loads 2048 (the capture's `expect`)."""
    config = settings(model="m", offload=True, gpu_blocks=1000)
    cached = {name: tokens_cached for name, tokens_cached, _ in asyncio.run(_replay_steps(config))}
    assert cached["E3-3 C alpha max_load_tokens 0"] == 0
    assert cached["E3-5 C alpha max_load_tokens 2048"] == 2048
    assert cached["E2-5 B2 alpha return"] == 4096


def test_a_load_is_counted_as_external_hits_and_host_cached_tokens() -> None:
    config, engine = build(offload=True, gpu_blocks=8)

    async def scenario() -> tuple[int, int]:
        prompt = tokens(128, 1000)
        await serve(engine, request(config, prompt))
        await serve(engine, request(config, tokens(128, 5000)))  # evicts the first prompt from the GPU
        return await hits(engine, config, prompt)

    assert asyncio.run(scenario()) == (0, 128)
    assert metric(engine, "vllm:prompt_tokens_cached_by_source_total", source="host") == 128
    assert metric(engine, "vllm:external_prefix_cache_hits_total") == 128
    assert metric(engine, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 128


def test_the_connector_is_asked_only_for_the_tokens_beyond_the_gpu_hit() -> None:
    config, engine = build(offload=True)
    prompt = tokens(128, 1000)
    asyncio.run(serve(engine, request(config, prompt)))
    asyncio.run(serve(engine, request(config, prompt)))  # GPU hit 112: 16 tokens asked of the CPU tier
    assert metric(engine, "vllm:external_prefix_cache_queries_total") == 128 + 16
    assert metric(engine, "vllm:external_prefix_cache_hits_total") == 0  # 16 tokens: less than a chunk


def test_kv_transfer_params_are_ignored_without_a_connector() -> None:
    config, engine = build()
    generation = request(config, tokens(64, 1000), kv_transfer_params={"max_load_tokens": 0})
    assert (generation.caps.max_load_tokens, generation.caps.max_offload_tokens) == (None, None)
    assert engine.offload is None


# --- load failures --------------------------------------------------------------------------------------------


async def _evict_then_reload(config: SimConfig, engine: Engine, **body: Any) -> tuple[int, int]:
    prompt = tokens(128, 1000)
    await serve(engine, request(config, prompt))
    await serve(engine, request(config, tokens(128, 5000)))
    run = await serve(engine, request(config, prompt, **body))
    return run.gpu_hit, run.loaded


def test_the_fail_load_directive_fails_the_load_under_the_fail_policy() -> None:
    config, engine = build(offload=True, gpu_blocks=8)

    async def scenario() -> None:
        prompt = "[[sim:fail-load]]" + "x" * 111  # 128 tokens
        await serve(engine, request(config, prompt))
        await serve(engine, request(config, tokens(128, 5000)))
        await serve(engine, request(config, prompt))

    with pytest.raises(LoadFailed):
        asyncio.run(scenario())
    assert engine.load_failures == 1
    assert (engine.running, engine.cache.blocks_in_use) == (0, 0)
    assert metric(engine, "vllm:request_success_total", finished_reason="error") == 1
    assert metric(engine, "vllm:external_prefix_cache_hits_total") == 0  # no prefill was reported
    assert engine.offload is not None and len(engine.offload.tier) == 4  # the copies stay under `fail`


def test_under_the_recompute_policy_the_failed_tokens_are_prefilled_and_stored_again() -> None:
    config, engine = build(offload=True, gpu_blocks=8, load_failure_policy="recompute")

    async def scenario() -> tuple[int, int, float]:
        prompt = "[[sim:fail-load]]" + "x" * 111
        await serve(engine, request(config, prompt))
        await serve(engine, request(config, tokens(128, 5000)))
        stores = metric(engine, "vllm:kv_offload_store_size_count")
        run = await serve(engine, request(config, prompt))
        return run.gpu_hit, run.loaded, metric(engine, "vllm:kv_offload_store_size_count") - stores

    assert asyncio.run(scenario()) == (0, 0, 1.0)
    assert engine.load_failures == 1
    assert metric(engine, "vllm:kv_offload_load_size_count") == 0
    assert metric(engine, "vllm:request_success_total", finished_reason="length") == 3


@pytest.mark.parametrize(("rate", "failures"), [(0.0, 0), (1.0, 1)])
def test_the_load_failure_rate(rate: float, failures: int) -> None:
    config, engine = build(offload=True, gpu_blocks=8, fail_loads=rate, load_failure_policy="recompute")
    assert asyncio.run(_evict_then_reload(config, engine)) == (0, 0 if failures else 128)
    assert engine.load_failures == failures


def test_a_request_that_loads_nothing_never_fails_a_load() -> None:
    config, engine = build(offload=True, fail_loads=1.0)
    asyncio.run(serve(engine, request(config, "[[sim:fail-load]]" + "y" * 200)))
    assert engine.load_failures == 0


# --- LMCache --------------------------------------------------------------------------------------------------


def test_lmcache_loads_whole_chunks_but_never_the_last_prompt_token() -> None:
    config, engine = build(lmcache=True, lmcache_chunk_size=64, gpu_blocks=8)

    async def scenario() -> list[tuple[int, int]]:
        prompt = tokens(128, 1000)
        out = [await hits(engine, config, prompt)]
        await serve(engine, request(config, tokens(128, 5000)))  # evicts the first prompt from the GPU
        out.append(await hits(engine, config, prompt))
        out.append(await hits(engine, config, prompt))  # now a GPU hit of 112 and 15 more from LMCache
        return out

    assert asyncio.run(scenario()) == [(0, 0), (0, 127), (112, 15)]
    assert engine.lmcache is not None
    assert engine.lmcache.hit_tokens_total == 127 + 15


def test_lmcache_identity_includes_the_salt() -> None:
    config, engine = build(lmcache=True, lmcache_chunk_size=64, gpu_blocks=8)

    async def scenario() -> list[int]:
        prompt = tokens(128, 1000)
        await serve(engine, request(config, prompt, cache_salt="a"))
        await serve(engine, request(config, tokens(128, 5000)))
        return [(await serve(engine, request(config, prompt, cache_salt=s))).loaded for s in ("b", "a")]

    assert asyncio.run(scenario()) == [0, 127]


def test_a_chat_request_is_prefilled_from_its_template() -> None:
    config, engine = build()
    messages = [{"role": "user", "content": "x" * 40}]
    first = asyncio.run(serve(engine, request(config, (), kind=Kind.CHAT, messages=messages)))
    second = asyncio.run(serve(engine, request(config, (), kind=Kind.CHAT, messages=messages)))
    assert first.prompt_len == 2 + len("user\n") + 40 + 1 + 1 + len("assistant\n")  # 60 tokens
    assert second.gpu_hit == 48
