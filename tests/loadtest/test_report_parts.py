"""The runner's pure parts on real data: vLLM 0.25.0 `/metrics` captures (tests/fixtures) and the statistics."""

from __future__ import annotations

from pathlib import Path

from gateway.devtools.loadtest.model import Scenario, TenantSpec
from gateway.devtools.loadtest.promtext import accumulating_samples, delta, info_labels, pick
from gateway.devtools.loadtest.stats import median_ci, median_difference_ci, quantile

METRICS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "metrics"
LOAD = "vllm:kv_offload_load_bytes_total"


def _samples(name: str) -> dict[str, float]:
    return accumulating_samples((METRICS / name).read_text())


def test_offload_counters_from_a_real_capture() -> None:
    change = delta(_samples("offload_metrics_before.txt"), _samples("offload_metrics_after.txt"))
    assert change[LOAD] == 14_155_776_000  # 12 returns of an 8000-token prefix, 1,179,648,000 B each
    assert change['vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}'] == 96_000
    assert pick(change, "vllm:kv_offload_total_bytes_total", transfer_type="CPU_to_GPU") == change[LOAD]
    assert not any(key.endswith(("_bucket", "_created")) for key in change)


def test_a_control_server_reports_zero_offload() -> None:
    change = delta(_samples("control_metrics_before.txt"), _samples("control_metrics_after.txt"))
    assert change[LOAD] == 0.0  # the family does not exist without a connector; reported as 0
    assert change["vllm:prompt_tokens_cached_total"] > 0


def test_gpu_cache_size_sets_the_pressure() -> None:
    labels = info_labels((METRICS / "control_metrics_after.txt").read_text(), "vllm:cache_config_info")
    assert labels["kv_cache_size_tokens"] == "20336"
    scenario = Scenario(name="t", tenants=[TenantSpec(name="acme")], prefix_tokens=8000)
    assert scenario.pressure_prompts(int(labels["kv_cache_size_tokens"])) == 4  # ceil(20336 / 8000) + 1


def test_statistics_are_repeatable() -> None:
    values = [0.1, 0.12, 0.11, 0.3, 0.105]
    assert quantile(values, 0.5) == 0.11
    assert quantile([1.0, 2.0], 0.5) == 1.5
    assert median_ci(values) == median_ci(values)
    difference = median_difference_ci([0.1, 0.11, 0.09], [0.23, 0.22, 0.24])
    assert difference is not None
    low, high = difference
    assert -0.15 <= low <= high <= -0.11  # every resampled difference lies between -0.15 and -0.11
    assert median_ci([]) is None
    assert median_difference_ci([], [1.0]) is None


def test_median_interval_brackets_the_median() -> None:
    """A constant sample has a zero-width interval; a spread one brackets its median inside its range."""
    assert median_ci([2.0] * 9) == (2.0, 2.0)
    values = [float(index) for index in range(1, 42)]  # median 21
    interval = median_ci(values)
    assert interval is not None
    low, high = interval
    assert 1.0 < low < 21.0 < high < 41.0
