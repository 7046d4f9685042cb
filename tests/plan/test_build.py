"""The plan from synthetic traces: unknowns stay unknown, the recommendation's bounds, the warnings, the sampled
error bound, the renderings and the plot."""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import msgspec

from gateway.plan.build import PlanInputs, build_plan
from gateway.plan.kvsize import ServerCache
from gateway.plan.plot import draw_curve
from gateway.plan.render import render
from gateway.reuse.record import TraceRecord

BLOCK = 16
BPT = 147456
SERVER = ServerCache(block_size=BLOCK, num_gpu_blocks=256, kv_cache_size_tokens=4096,
                     kv_cache_memory_bytes=4096 * BPT, offloading_backend="native", offloading_size_gib=None,
                     cache_dtype="auto")


def chain(doc: str, blocks: int, tail: str) -> bytes:
    """Fingerprint-like chain: `blocks` blocks of a document, then one block of its own."""
    out, previous = [], b""
    for index in range(blocks):
        previous = hashlib.blake2b(previous + f"{doc}:{index}".encode(), digest_size=8).digest()
        out.append(previous)
    out.append(hashlib.blake2b(previous + tail.encode(), digest_size=8).digest())
    return b"".join(out)


def record(ts: float, doc: str, blocks: int, tail: str, rate: float = 1.0) -> TraceRecord:
    prompt = (blocks + 1) * BLOCK + 8
    return TraceRecord(ts=ts, tenant="acme", pool="main", epoch=1, prompt_tokens=prompt, cached_tokens=0,
                       completion_tokens=1, text=False, chunk_units=BLOCK, tokens_per_chunk=float(BLOCK), rate=rate,
                       chain=chain(doc, blocks, tail))


def hot_trace(requests: int = 120, docs: int = 6, rate: float = 1.0) -> list[TraceRecord]:
    """`docs` documents of 64 blocks (1,024 tokens) in turn: 6 x 1,024 tokens overflow a 4,096-token GPU cache."""
    return [record(float(i), f"doc{i % docs}", 64, f"q{i}", rate) for i in range(requests)]


def test_unknowns_are_unknown_not_zero() -> None:
    plan = build_plan(hot_trace(), PlanInputs(gpu_kv_tokens=4096, block_size=BLOCK))
    assert plan["kv"]["bytes_per_token"] is None and plan["kv"]["gpu_kv_cache_bytes"] is None
    assert plan["budgets"]["host_ram_bytes"] is None and plan["budgets"]["left_for_tier_bytes"] is None
    assert set(plan["budgets"]["unknown"]) == {"host_ram", "weights_in_host_ram", "headroom", "cache_process_rss"}
    assert plan["recommendation"]["cpu_bytes_to_use"] is None
    assert plan["curve"][0]["cpu_bytes"] is None and plan["curve"][-1]["cpu_to_gpu_bytes_per_hour"] is None
    assert plan["knee"]["cpu_tokens"] > 0  # still known in tokens
    text = render(plan, "table")
    assert "unknown" in text and "KV bytes per token  unknown" in text


def test_recommendation_bounds_and_reasons() -> None:
    plan = build_plan(hot_trace(), PlanInputs(server=SERVER))
    knee, rec = plan["knee"], plan["recommendation"]
    assert knee["cpu_share"] > 0.5  # the documents return from the tier
    assert rec["cpu_bytes_to_use"] >= SERVER.kv_cache_memory_bytes  # never below the GPU KV cache
    assert rec["cpu_bytes_to_use"] % (64 * BPT) == 0  # whole 64-token chunks
    capped = build_plan(hot_trace(), PlanInputs(server=SERVER, host_ram_bytes=15 * 10**8, headroom_bytes=10**9))
    assert 0 < capped["recommendation"]["cpu_bytes_to_use"] <= 5 * 10**8 < knee["cpu_bytes"]
    assert any("more than the RAM left" in w for w in capped["warnings"])
    assert any("weights_in_host_ram, cache_process_rss" in w for w in capped["warnings"])


def test_warnings_for_small_tiers_and_one_off_traffic() -> None:
    small = build_plan(hot_trace(), PlanInputs(server=SERVER, current_cpu_bytes=10**8))
    assert any("smaller than the GPU KV cache" in w for w in small["warnings"])
    one_off = [record(float(i), f"upload{i}", 64, "q") for i in range(60)]
    plan = build_plan(one_off, PlanInputs(server=SERVER))
    assert any("offload will not pay" in w for w in plan["warnings"])
    assert any("mostly one-off traffic" in w for w in plan["warnings"])
    assert plan["working_set"][0]["returning_tokens"] == 0


def test_sampled_trace_carries_an_error_bound() -> None:
    rng = random.Random(3)  # documents of uneven popularity, so roots differ in how much they reuse
    trace = [record(float(i), f"doc{rng.choices(range(40), [1 / (k + 1) for k in range(40)])[0]}", 16, f"q{i}",
                    rate=0.5) for i in range(400)]
    plan = build_plan(trace, PlanInputs(server=SERVER))
    assert plan["trace"]["sample_rate"] == 0.5
    bound = plan["knee"]["error_bound"]
    assert bound["sampled"] and bound["cpu_share"] > 0
    exact = build_plan(hot_trace(), PlanInputs(server=SERVER))
    assert exact["knee"]["error_bound"] == {"gpu_share": 0.0, "cpu_share": 0.0, "sampled": False}
    assert "±" in render(plan, "md")


def test_plot_is_a_png(tmp_path: Path) -> None:
    plan = build_plan(hot_trace(), PlanInputs(server=SERVER))
    draw_curve(plan, tmp_path / "curve.png")
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_sampled_trace_predicts_what_the_full_trace_does() -> None:
    """SHARDS: a fifth of 10,000 prefix roots, caches scaled by a fifth, give the full trace's shares within the
    stated bound (plus a point: a 95 % bound, and popular roots left out of a sample can move it further)."""
    rng = random.Random(5)
    picks = rng.choices(range(10_000), [1 / (k + 1) ** 0.7 for k in range(10_000)], k=20_000)
    full = [record(float(i), f"doc{doc}", 4, f"q{i}") for i, doc in enumerate(picks)]
    server = ServerCache(block_size=BLOCK, num_gpu_blocks=4096, kv_cache_size_tokens=4096 * BLOCK,
                         kv_cache_memory_bytes=4096 * BLOCK * BPT, offloading_backend="native",
                         offloading_size_gib=None, cache_dtype="auto")
    inputs = PlanInputs(server=server, evaluate_cpu_bytes=[15 * 10**9])
    exact = build_plan(full, inputs)["evaluated"][0]
    sampled = build_plan([msgspec.structs.replace(r, rate=0.2) for r in full], inputs)["evaluated"][0]
    assert sampled["error_bound"]["sampled"] and not exact["error_bound"]["sampled"]
    for share in ("gpu_share", "cpu_share"):
        assert 0 < sampled["error_bound"][share] < 0.1
        assert abs(sampled[share] - exact[share]) <= sampled["error_bound"][share] + 0.01, (share, sampled, exact)
