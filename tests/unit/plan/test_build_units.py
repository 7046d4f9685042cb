"""`build_plan` on a trace worked out by hand, through its public output only: the trace and KV sections, the
curve and its knee, the recommendation (raised, capped, rounded), the budgets, and each warning and note.

The hand trace: a 128-token document (8 blocks of 16, 2 chunks of 64) sent twice, 1,800 s apart, with a
one-block GPU cache. Request 2 hits 16 tokens on the GPU; a tier of 2 chunks serves the other 112, a tier of 1
chunk nothing (its LRU keeps chunk 1, the lookup starts at chunk 0). Unbounded: 112 of 256 tokens = 0.4375."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.plan.build import PlanInputs, build_plan
from gateway.plan.kvsize import ModelShape, ServerCache
from gateway.reuse.record import TraceRecord
from tests.unit.plan.traces import BLOCK, BPT, ONE_BLOCK_GPU, blocks, doc_twice, rec


def plan_of(records: list[TraceRecord] | None = None, **inputs: Any) -> dict[str, Any]:
    return build_plan(doc_twice() if records is None else records, PlanInputs(**{"server": ONE_BLOCK_GPU, **inputs}))


def test_the_hand_trace_gives_the_hand_curve() -> None:
    plan = plan_of()
    assert plan["unbounded_cpu_share"] == pytest.approx(112 / 256)
    assert plan["gpu_only_share"] == pytest.approx(16 / 256)
    curve = plan["curve"]
    # top = ceil(2 distinct chunks x 1.05) = 3; 16 steps of 3 round to 0, 1, 2, 3
    assert [p["cpu_tokens"] for p in curve] == [0.0, 64.0, 128.0, 192.0]
    assert [p["cpu_bytes"] for p in curve] == [0.0, 64e3, 128e3, 192e3]
    assert [p["cpu_share"] for p in curve] == [0.0, 0.0, pytest.approx(0.4375), pytest.approx(0.4375)]
    assert [p["label"] for p in curve] == [None, None, "knee", None]
    assert all(p["recomputed_share"] == pytest.approx(1 - p["gpu_share"] - p["cpu_share"]) for p in curve)


def test_the_knee_is_the_smallest_tier_within_95_percent_of_unbounded() -> None:
    knee = plan_of()["knee"]
    assert (knee["label"], knee["cpu_tokens"], knee["cpu_bytes"]) == ("knee", 128.0, 128e3)
    assert knee["error_bound"] == {"gpu_share": 0.0, "cpu_share": 0.0, "sampled": False}


def test_transfer_figures_per_hour_over_the_trace_span() -> None:
    """112 tokens served over a 1,800 s span: 224 tokens and 224 kB an hour; the load time at the link speed."""
    knee = plan_of(link_bytes_per_s=1e6)["knee"]
    assert knee["cpu_to_gpu_tokens_per_hour"] == pytest.approx(224.0)
    assert knee["cpu_to_gpu_bytes_per_hour"] == pytest.approx(224e3)
    assert knee["load_seconds_per_hour"] == pytest.approx(0.224)


def test_a_span_under_a_second_has_no_hourly_figures() -> None:
    names = blocks("doc", 8)
    knee = plan_of([rec(names, ts=5.0), rec(names, ts=5.5)])["knee"]
    assert knee["cpu_to_gpu_tokens_per_hour"] is None and knee["load_seconds_per_hour"] is None


def test_ttft_saving_is_prefill_minus_load_time_per_request() -> None:
    """112 CPU tokens over 2 requests, each saving 1 ms of prefill less 1000 B / 1 MB/s = 1 ms of load: zero;
    at 2 ms prefill a token: 112 x 1 ms / 2 = 56 ms a request."""
    assert plan_of(prefill_s_per_token=0.001, link_bytes_per_s=1e6)["knee"]["ttft_saving_ms_per_request"] == \
        pytest.approx(0.0)
    assert plan_of(prefill_s_per_token=0.002, link_bytes_per_s=1e6)["knee"]["ttft_saving_ms_per_request"] == \
        pytest.approx(56.0)
    assert plan_of()["knee"]["ttft_saving_ms_per_request"] is None  # prefill speed unknown


def test_the_recommendation_is_the_knee_in_whole_chunks_with_its_reasons() -> None:
    rec_ = plan_of()["recommendation"]
    assert rec_["cpu_bytes_to_use"] == 128_000
    assert rec_["kv_offloading_size_gib"] == pytest.approx(128_000 / 2**30)
    assert rec_["point"]["label"] == "recommended" and rec_["point"]["cpu_share"] == pytest.approx(0.4375)
    assert rec_["reasons"][0].startswith("the tier serves 43.8% of prompt tokens at 0.00 GB — 95% of the 43.8%")
    assert "not checked against host RAM (unknown: give --host-ram)" in rec_["reasons"]


def test_a_tier_smaller_than_the_gpu_cache_is_raised_to_it() -> None:
    """A 300-token GPU cache keeps the document on the GPU (knee: no tier at all); a CPU tier smaller than the
    GPU cache would only hold copies, so the size is raised to 300 x 1000 B, rounded up to 64 kB chunks."""
    server = ServerCache(block_size=BLOCK, num_gpu_blocks=None, kv_cache_size_tokens=None,
                         kv_cache_memory_bytes=None, offloading_backend=None, offloading_size_gib=None,
                         cache_dtype=None)
    plan = plan_of(server=server, gpu_kv_tokens=300, block_size=BLOCK, model=ModelShape(1, 1, 250, "float16", 1))
    assert plan["knee"]["cpu_tokens"] == 0.0
    assert plan["recommendation"]["cpu_bytes_to_use"] == 320_000
    reasons = plan["recommendation"]["reasons"]
    assert any(reason.startswith("raised to the GPU KV cache (0.00 GB)") for reason in reasons)


@pytest.mark.parametrize(("host_ram", "expected"), [
    (100_000, 64_000),  # 100 kB left: floor to whole chunks
    (127_999, 64_000),
    (128_000, 128_000),  # exactly the knee: not capped
    (10_000, 0),  # less than a chunk: nothing
])
def test_the_recommendation_is_capped_at_the_ram_left(host_ram: int, expected: int) -> None:
    plan = plan_of(host_ram_bytes=host_ram, weights_bytes=0, headroom_bytes=0, cache_process_rss_bytes=0)
    assert plan["budgets"]["left_for_tier_bytes"] == host_ram
    assert plan["recommendation"]["cpu_bytes_to_use"] == expected
    capped = any("more than the RAM left for it" in w for w in plan["warnings"])
    assert capped == (expected < 128_000)


def test_budgets_subtract_what_is_known_and_name_what_is_not() -> None:
    plan = plan_of(host_ram_bytes=100 * 10**9, weights_bytes=20 * 10**9, headroom_bytes=10 * 10**9)
    budgets = plan["budgets"]
    assert budgets["left_for_tier_bytes"] == 70 * 10**9
    assert budgets["unknown"] == ["cache_process_rss"]
    assert budgets["active_requests_gpu_bytes"] == BLOCK * BPT
    assert budgets["reusable_blocks_bytes"] == 128e3
    assert any("does not subtract cache_process_rss (unknown)" in w for w in plan["warnings"])
    complete = plan_of(host_ram_bytes=10**9, weights_bytes=0, headroom_bytes=0, cache_process_rss_bytes=5)
    assert complete["budgets"]["unknown"] == [] and complete["budgets"]["left_for_tier_bytes"] == 10**9 - 5
    assert not any("does not subtract" in w for w in complete["warnings"])


def test_the_trace_section() -> None:
    trace = [*doc_twice(), rec(blocks("x", 2), ts=900.0, tenant="beta", cached=8)]
    section = plan_of(sorted(trace, key=lambda r: r.ts))["trace"]
    assert section == {"records": 3, "sample_rate": 1.0, "span_s": 1800.0, "first": 0.0, "last": 1800.0,
                       "tenants": ["acme", "beta"], "text_records": 0, "prompt_tokens": 288.0,
                       "observed_cached_share": pytest.approx(24 / 288)}


def test_the_kv_section_from_the_server_across_ranks() -> None:
    kv = plan_of(tensor_parallel=2)["kv"]
    assert kv["bytes_per_token"] == 1000.0 and kv["bytes_per_token_all_ranks"] == 2000.0
    assert kv["bytes_per_token_source"] == "server /metrics (vllm:cache_config_info)"
    assert (kv["gpu_kv_cache_tokens"], kv["gpu_kv_cache_bytes"], kv["block_size"]) == (16, 16_000, 16)
    assert kv["disagreement"] is None


def test_the_model_figure_is_used_without_a_server_and_disagreement_is_warned() -> None:
    model = ModelShape(layers=2, kv_heads=1, head_dim=125, dtype="float16", tensor_parallel=1)  # 1000 B
    only_model = build_plan(doc_twice(), PlanInputs(model=model, gpu_kv_tokens=16, block_size=BLOCK))
    assert only_model["kv"]["bytes_per_token_source"] == "model config.json"
    assert only_model["kv"]["gpu_kv_cache_bytes"] == 16_000
    assert only_model["recommendation"]["cpu_bytes_to_use"] == 128_000
    twice = ModelShape(layers=4, kv_heads=1, head_dim=125, dtype="float16", tensor_parallel=1)  # 2000 B
    both = plan_of(model=twice)
    assert both["kv"]["bytes_per_token"] == 1000.0  # the server's own figure wins
    assert both["kv"]["disagreement"] is not None and both["kv"]["disagreement"] in both["warnings"]


def test_an_overridden_gpu_size_is_priced_from_the_tokens_given() -> None:
    kv = plan_of(gpu_kv_tokens=64)["kv"]
    assert (kv["gpu_kv_cache_tokens"], kv["gpu_kv_cache_bytes"]) == (64, 64_000)


def test_no_bytes_per_token_gives_sizes_in_tokens_only() -> None:
    plan = build_plan(doc_twice(), PlanInputs(gpu_kv_tokens=16, block_size=BLOCK, evaluate_cpu_bytes=[10**6]))
    assert plan["recommendation"]["cpu_bytes_to_use"] is None
    assert plan["recommendation"]["reasons"] == ["the KV bytes per token are unknown, so no byte size can be given; "
                                                 "the knee is at 128 tokens"]
    assert plan["evaluated"] == []
    assert "--cpu-bytes needs the KV bytes per token; not evaluated" in plan["warnings"]
    assert any(w.startswith("KV bytes per token unknown") for w in plan["warnings"])


def test_evaluated_sizes_are_whole_chunks_of_the_bytes_given() -> None:
    evaluated = plan_of(evaluate_cpu_bytes=[64_000, 127_999, 128_000])["evaluated"]
    assert [p["cpu_tokens"] for p in evaluated] == [64.0, 64.0, 128.0]
    assert [p["cpu_share"] for p in evaluated] == [0.0, 0.0, pytest.approx(0.4375)]
    assert [p["label"] for p in evaluated] == ["64000 bytes", "127999 bytes", "128000 bytes"]


def test_without_a_gpu_size_there_is_no_curve() -> None:
    plan = build_plan(doc_twice(), PlanInputs())
    assert (plan["curve"], plan["knee"], plan["recommendation"]) == (None, None, None)
    assert any(w.startswith("the GPU KV cache size is unknown") for w in plan["warnings"])
    assert plan["budgets"]["reusable_blocks_bytes"] is None


def test_an_empty_selection_says_so() -> None:
    plan = build_plan([], PlanInputs(server=ONE_BLOCK_GPU))
    assert plan["pool"] is None and plan["curve"] is None
    assert "no trace records for this selection: nothing to predict from" in plan["warnings"]
    assert plan["trace"]["records"] == 0 and plan["trace"]["observed_cached_share"] is None


def test_the_busiest_pool_is_chosen_unless_one_is_named() -> None:
    trace = [*doc_twice(pool="a"), rec(blocks("x", 8), ts=10.0, pool="b")]
    chosen = plan_of(trace)
    assert chosen["pool"] == "a" and chosen["trace"]["records"] == 2
    assert "planned pool 'a' (most requests); the trace also has b (1): use --pool" in chosen["notes"]
    named = plan_of(trace, pool="b")
    assert named["pool"] == "b" and named["trace"]["records"] == 1
    assert not any("planned pool" in note for note in named["notes"])


def test_a_sampled_trace_keeps_one_consistent_sample_and_says_so() -> None:
    trace = [rec(blocks(f"doc{i}", 8), ts=float(i), rate=0.5 if i % 2 else 1.0) for i in range(40)]
    plan = plan_of(trace)
    assert plan["trace"]["sample_rate"] == 0.5
    assert 0 < plan["trace"]["records"] < 40  # only roots under the lowest threshold remain
    assert any(note.startswith("sampled at 0.5 (whole prefix chains") for note in plan["notes"])


def test_mismatched_trace_blocks_and_text_prompts_are_flagged() -> None:
    names = blocks("doc", 8)
    wrong_block = plan_of([rec(names), rec(names)], block_size=32)
    assert any("cut token-id prompts every [16] tokens but the server's block is 32" in w
               for w in wrong_block["warnings"])
    text = plan_of([rec(names, text=True), rec(names, text=True)])
    assert any(note.startswith("text and chat prompts were fingerprinted by characters") for note in text["notes"])
    assert not any("cut token-id prompts" in w for w in text["warnings"])


@pytest.mark.parametrize(("field", "value", "note"), [
    ("max_offload", 64, "100% of requests limited what the tier stores"),
    ("max_load", 64, "100% of requests carried max_load_tokens; modelled"),
])
def test_caps_in_the_trace_are_noted(field: str, value: int, note: str) -> None:
    plan = plan_of(doc_twice(**{field: value}))
    assert any(n.startswith(note) for n in plan["notes"])


def test_an_ignored_max_load_is_noted_and_not_modelled() -> None:
    honoured = plan_of(doc_twice(max_load=64))
    ignored = plan_of(doc_twice(max_load=64), honour_max_load=False)
    # honoured: the cap ends the load at token 80, so whole chunks give 64 - 16 = 48 tokens, less than one
    # chunk's worth: nothing loads
    assert honoured["unbounded_cpu_share"] == 0.0
    assert ignored["unbounded_cpu_share"] == pytest.approx(112 / 256)
    assert any("ignored, as this server does" in n for n in ignored["notes"])


def test_traffic_that_never_returns_is_warned_as_not_paying_and_one_off() -> None:
    trace = [rec(blocks(f"upload{i}", 8), ts=float(i)) for i in range(10)]
    plan = plan_of(trace)
    assert plan["unbounded_cpu_share"] == 0.0 and plan["knee"]["cpu_tokens"] == 0.0
    assert any("would serve only 0.0% of prompt tokens on this traffic: offload will not pay" in w
               for w in plan["warnings"])
    assert any(w.startswith("mostly one-off traffic: 100% of prompt tokens") for w in plan["warnings"])


def test_a_current_tier_smaller_than_the_gpu_cache_is_warned_and_priced() -> None:
    plan = plan_of(current_cpu_bytes=8_000)
    assert any("the CPU tier in use (0.00 GB) is smaller than the GPU KV cache" in w for w in plan["warnings"])
    assert "today's tier of 0.00 GB serves 0.0%" in plan["recommendation"]["reasons"]
    from_server = ServerCache(**{**ONE_BLOCK_GPU.__dict__, "offloading_size_gib": 1.0})
    reasons = plan_of(server=from_server)["recommendation"]["reasons"]
    assert "today's tier of 1.07 GB serves 43.8%" in reasons  # 1 GiB from the server's kv_offloading_size


def test_a_working_set_beyond_host_ram_is_warned() -> None:
    beyond = plan_of(host_ram_bytes=1_000)  # 128 returning tokens x 1000 B = 128 kB > 1 kB
    assert any("the working set (0.00 GB) is beyond the host's RAM" in w for w in beyond["warnings"])
    unknown = plan_of()
    assert "the working set was not checked against the host's RAM (unknown: give --host-ram)" in unknown["notes"]


def test_working_set_views_are_priced_in_bytes_across_ranks() -> None:
    views = plan_of(tensor_parallel=2, windows_s=(600.0, 3600.0))["working_set"]
    assert [v["window_s"] for v in views] == [600.0, 3600.0]
    assert [v["windows_in_trace"] for v in views] == [2, 1]
    long_window = views[1]
    assert (long_window["returning_tokens"], long_window["returning_bytes"]) == (128.0, 256_000.0)
    assert long_window["busiest_window_requests"] == 2 and long_window["one_off_share"] == 0.0
