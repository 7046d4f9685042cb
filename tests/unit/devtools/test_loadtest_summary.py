"""From raw rows to `report.json` (gateway.devtools.loadtest.summary, .stats, .promtext): per-arm figures,
ΔTTFT, the direct-vs-gateway pairs, checks, the restart view and the whole report, on runs made by hand."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.devtools.loadtest.promtext import accumulating_samples, add_into, delta, pick, sample_key
from gateway.devtools.loadtest.runner import RawRun
from gateway.devtools.loadtest.stats import mean, median_ci, median_difference_ci, quantile
from gateway.devtools.loadtest.summary import (
    arm_summary,
    build_report,
    checks,
    direct_vs_gateway,
    measured_rows,
    phase_summaries,
    restart_view,
    rows_of,
)
from tests.unit.devtools.runs import LOAD, hand_run, row

# -- statistics -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 0.5, None), ([3.0], 0.9, 3.0), ([1.0, 2.0, 3.0, 4.0], 0.5, 2.5), ([4.0, 1.0, 3.0, 2.0], 0.9, 3.7),
    ([1.0, 2.0, 3.0, 4.0], 0.0, 1.0), ([1.0, 2.0, 3.0, 4.0], 1.0, 4.0), ([0.0, 10.0], 0.99, 9.9),
])
def test_quantile_interpolates_linearly(values: list[float], q: float, expected: float | None) -> None:
    assert quantile(values, q) == (pytest.approx(expected) if expected is not None else None)


def test_mean_of_nothing_is_unknown() -> None:
    assert mean([]) is None and mean([1.0, 2.0, 6.0]) == 3.0


@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=12))
@settings(max_examples=30, deadline=None)
def test_the_median_interval_lies_within_the_sample(values: list[float]) -> None:
    interval = median_ci(values)
    assert interval is not None
    low, high = interval
    assert min(values) <= low <= high <= max(values)


def test_a_difference_interval_of_separated_samples_excludes_zero() -> None:
    interval = median_difference_ci([1.0, 1.1, 0.9, 1.05], [2.0, 2.2, 1.9, 2.1])
    assert interval is not None and interval[1] < 0


# -- Prometheus text ------------------------------------------------------------------------------------------

EXPOSITION = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100
vllm:prompt_tokens_total{engine="1",model_name="m"} 50
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 30
vllm:prompt_tokens_by_source_total{engine="0",source="external_kv_transfer",model_name="m"} 70
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1"} 2
vllm:time_to_first_token_seconds_sum{engine="0"} 0.5
vllm:time_to_first_token_seconds_count{engine="0"} 4
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0"} 1.7e9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 3
"""


def test_only_accumulating_samples_are_kept_and_engines_summed() -> None:
    assert accumulating_samples(EXPOSITION) == {
        "vllm:prompt_tokens_total": 150.0,
        'vllm:prompt_tokens_by_source_total{source="local_compute"}': 30.0,
        'vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}': 70.0,
        "vllm:time_to_first_token_seconds_sum": 0.5,
        "vllm:time_to_first_token_seconds_count": 4.0,
    }


@pytest.mark.parametrize(("labels", "key"), [
    ({}, "n"), ({"engine": "0", "model_name": "m"}, "n"), ({"b": "2", "a": "1"}, 'n{a="1",b="2"}'),
    ({"engine": "0", "pool": "ü"}, 'n{pool="ü"}'),
])
def test_sample_keys_drop_engine_and_model_and_sort_labels(labels: dict[str, str], key: str) -> None:
    assert sample_key("n", labels) == key


def test_delta_keeps_changes_and_always_reports_the_key_families() -> None:
    before = {"a": 1.0, "b": 5.0, "gone": 3.0}
    after = {"a": 4.0, "b": 5.0, "new": 2.0}
    assert delta(before, after, always=("k",)) == {"k": 0.0, "a": 3.0, "new": 2.0}
    assert delta({}, {}, always=("k",)) == {"k": 0.0}
    assert delta({"k": 1.0}, {"k": 0.5}, always=("k",)) == {"k": -0.5}  # a reset counter shows as negative


def test_add_into_and_pick() -> None:
    total = {"x": 1.0}
    add_into(total, {"x": 2.0, "y": 3.0})
    assert total == {"x": 3.0, "y": 3.0}
    samples = {'t{pool="a",route="/v1"}': 1.0, 't{pool="b"}': 2.0, "t": 4.0, "tt": 8.0, 't{pool="ab"}': 16.0}
    assert pick(samples, "t") == 23.0
    assert pick(samples, "t", pool="a") == 1.0
    assert pick(samples, "t", pool="a", route="/v1") == 1.0
    assert pick(samples, "t", pool="c") == 0.0


# -- per-arm figures ------------------------------------------------------------------------------------------


def test_arm_summary_of_four_answers_and_one_failure() -> None:
    rows = [row(ttft=0.1, cached=50, overhead=1.0), row(ttft=0.2, cached=50, overhead=2.0),
            row(ttft=0.3, cached=100, overhead=3.0), row(ttft=0.4, cached=None, overhead=None, misrouted=True),
            row(ttft=None, status=500, error="HTTP 500", cached=999)]
    summary = arm_summary(rows)
    assert (summary["n"], summary["errors"], summary["misrouted"]) == (5, 1, 1)
    assert summary["ttft_p50_s"] == pytest.approx(0.25) and summary["ttft_p90_s"] == pytest.approx(0.37)
    assert (summary["ttft_min_s"], summary["ttft_max_s"]) == (0.1, 0.4)
    assert summary["ttft_mean_s"] == pytest.approx(0.25)
    assert summary["cached_tokens_mean"] == pytest.approx(200 / 3)
    assert summary["cached_share"] == pytest.approx(200 / 300)  # the answer without a cached count is left out
    assert summary["overhead_ms_p50"] == 2.0
    assert "offload_load_bytes" not in summary


@pytest.mark.parametrize("failed", [
    row(status=429), row(error="stream cut"), row(ttft=None),
])
def test_a_row_is_an_error_unless_200_without_error_and_with_a_ttft(failed: dict[str, Any]) -> None:
    summary = arm_summary([failed])
    assert (summary["n"], summary["errors"], summary["ttft_p50_s"], summary["ttft_ci95_s"]) == (1, 1, None, None)


def test_an_empty_arm_is_all_unknown_not_zero() -> None:
    summary = arm_summary([])
    assert summary["n"] == 0 and summary["errors"] == 0
    assert all(summary[key] is None for key in ("ttft_p50_s", "ttft_mean_s", "cached_tokens_mean", "cached_share",
                                                "overhead_ms_p50", "ttft_min_s"))


def test_load_bytes_are_summed_over_rows_measured_one_by_one() -> None:
    rows = [row(upstream_delta={LOAD: 1000.0}), row(upstream_delta={LOAD: 500.0, "other": 1.0}),
            row(upstream_delta={"other": 1.0}), row(upstream_delta=None)]
    assert arm_summary(rows)["offload_load_bytes"] == 1500.0


def test_phase_summaries_give_delta_ttft_per_phase_and_tenant() -> None:
    rows = [row("acme", "offload", "return", 0.1), row("acme", "offload", "return", 0.3),
            row("acme", "control", "return", 0.5), row("beta", "control", "return", 0.9),
            row("acme", "offload", "cold", 1.0), row("acme", "control", "cold", 1.2)]
    phases = phase_summaries(rows, ["acme", "beta", "gamma"])
    assert list(phases) == ["cold", "return"]  # protocol order, phases without rows left out
    assert phases["return"]["delta_ttft_p50_s"] == pytest.approx(0.2 - 0.7)
    tenants = phases["return"]["tenants"]
    assert set(tenants) == {"acme", "beta"}  # gamma sent nothing
    assert tenants["acme"]["delta_ttft_p50_s"] == pytest.approx(0.2 - 0.5)
    assert tenants["beta"]["delta_ttft_p50_s"] is None and tenants["beta"]["offload"]["n"] == 0
    assert phases["cold"]["delta_ttft_p50_s"] == pytest.approx(-0.2)
    low, high = phases["cold"]["delta_ttft_ci95_s"]
    assert low == high == pytest.approx(-0.2)


def test_measured_rows_leave_out_warm_up_and_probes() -> None:
    raw = RawRun({}, {}, 0, requests=[row(), row(warmup=True), row(role="probe"), row(role="pressure")])
    assert [r["role"] for r in measured_rows(raw)] == ["prefix", "pressure"]


def test_direct_vs_gateway_uses_complete_pairs_only() -> None:
    rows = [row(arm="control", phase="overhead", role="direct", rep=0, ttft=0.10),
            row(arm="control", phase="overhead", role="gateway", rep=0, ttft=0.12),
            row(arm="control", phase="overhead", role="gateway", rep=1, ttft=0.21),
            row(arm="control", phase="overhead", role="direct", rep=1, ttft=0.20),
            row(arm="control", phase="overhead", role="direct", rep=2, ttft=0.30),  # its gateway half failed:
            row(arm="control", phase="overhead", role="gateway", rep=2, ttft=None, status=502),
            row(arm="control", phase="return", role="prefix", rep=0, ttft=9.0)]
    pairs = direct_vs_gateway(rows)
    assert pairs is not None
    assert pairs["pairs"] == 2
    assert pairs["direct_ttft_p50_s"] == pytest.approx(0.15)
    assert pairs["gateway_ttft_p50_s"] == pytest.approx(0.165)
    assert pairs["added_ttft_p50_s"] == pytest.approx(0.015)
    assert pairs["share_of_direct_p50"] == pytest.approx(0.1)
    assert direct_vs_gateway(rows[-3:]) is None


@pytest.mark.parametrize(("control_cached", "evicted"), [(None, None), (0, True), (49, True), (50, False)])
def test_pressure_evicted_the_prefix_when_control_cached_under_half(control_cached: int | None,
                                                                   evicted: bool | None) -> None:
    rows = [row(arm="control", cached=control_cached)] if control_cached is not None else [row(phase="cold")]
    result = checks([*rows, row(status=500)], phase_summaries(rows, ["acme"]), prefix_tokens=100)
    assert result["pressure_evicted_prefix"] is evicted
    assert result["errors"] == 1


def test_rows_of_selects_measured_rows_of_a_phase_arm_and_tenant() -> None:
    report = {"requests": [row("acme"), row("beta"), row("acme", arm="control"), row("acme", warmup=True),
                           row("acme", role="probe"), row("acme", phase="cold")]}
    assert len(list(rows_of(report, "return", "offload"))) == 2
    assert [r["tenant"] for r in rows_of(report, "return", "offload", "beta")] == ["beta"]


# -- restarts and the whole report ----------------------------------------------------------------------------


def _audit(resident: int, restart: int, lost: int) -> dict[str, Any]:
    return {"tenants": {"acme": {"CPU": {"stored": 10, "resident": resident,
                                         "closed_by": {"restart": restart, "lost": lost}},
                                 "not_auditable": "x"}},
            "gaps": [{"source": "offload/0", "restarts": restart}]}


def test_restart_view_counts_closures_during_the_restart() -> None:
    raw = RawRun({}, {}, 0, restarts=[{"arm": "offload"}],
                 ledger_restart={"pools": ["offload"], "observed": True, "before": _audit(7, 1, 0),
                                 "after": _audit(2, 4, 1)})
    view = restart_view(raw)
    assert view["closed_by_restart"] == {"acme": {"CPU": {"restart": 3, "lost": 1}}}
    assert view["resident_before"] == {"acme": {"CPU": 7}} and view["resident_after"] == {"acme": {"CPU": 2}}
    assert view["gaps_before"] == [{"source": "offload/0", "restarts": 1}]
    assert view["ledger_observed"] is True


def test_a_skipped_restart_is_reported_as_skipped() -> None:
    raw = RawRun({}, {}, 0, ledger_restart={"skipped": "no restart hook"})
    assert restart_view(raw) == {"restarts": [], "ledger": {"skipped": "no restart hook"}}


def test_the_whole_report_of_a_hand_run() -> None:
    report = build_report(hand_run())
    assert report["schema"] == "kvgate-loadtest/1" and report["duration_s"] == 60.0
    assert report["phases"]["return"]["delta_ttft_p50_s"] == pytest.approx(-0.2)
    overhead = report["gateway_overhead"]
    assert overhead["requests"] == 4 and overhead["header_ms_p50"] == pytest.approx(1.5)
    assert overhead["metric_mean_s"] == pytest.approx(0.0015) and overhead["metric_count"] == 4.0
    assert overhead["cold_control_ttft_p50_s"] == 1.0
    assert overhead["share_of_cold_ttft_p50"] == pytest.approx(0.0015)
    assert overhead["direct_vs_gateway"] is None
    decomposition = overhead["ttft_decomposition_mean_s"]
    assert decomposition["offload"]["return"] == {"engine": pytest.approx(0.08), "gateway": pytest.approx(0.1),
                                                  "client": pytest.approx(0.1)}
    assert decomposition["control"]["return"] == {"engine": None, "gateway": None, "client": pytest.approx(0.3)}
    assert report["ledger"] == {"acme": {"CPU": {"stored": 12, "resident": 3}}}
    assert report["ledger_timeline"] == [{"t": 1.0, "label": "start", "phase": None, "rep": None,
                                          "resident": {"acme": {"CPU": 3}}}]
    assert report["checks"]["pressure_evicted_prefix"] is True
    assert report["verdict"]["acme"].startswith("acme: yes, the CPU tier served the return")
    assert len(report["requests"]) == 5  # every raw row, warm-up included, is kept
