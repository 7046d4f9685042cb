"""The sentences and tables of a load-test report (gateway.devtools.loadtest.verdict and .markdown): every branch
of the per-tenant verdict, the byte and time formats, and the Markdown sections of a report built by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from gateway.devtools.loadtest.markdown import render_markdown, table
from gateway.devtools.loadtest.summary import build_report
from gateway.devtools.loadtest.verdict import fmt_bytes, tenant_verdict, verdicts
from tests.unit.devtools.runs import hand_run

LOAD = "vllm:kv_offload_load_bytes_total"


@pytest.mark.parametrize(("value", "text"), [
    (0.0, "0 B"), (999.0, "999 B"), (999.6, "1000 B"), (1000.0, "1.00 kB"), (1_500.0, "1.50 kB"),
    (1e6, "1.00 MB"), (1_179_648_000.0, "1.18 GB"), (2e12, "2000.00 GB"), (-2e6, "-2.00 MB"), (-5.0, "-5 B"),
])
def test_fmt_bytes(value: float, text: str) -> None:
    assert fmt_bytes(value) == text


def _report(offload: dict[str, Any], control: dict[str, Any], *, delta: float | None = -0.2,
            ci: list[float] | None = None, ledger: dict[str, Any] | None = None,
            phase_load: float = 0.0, repeat_load: float = 0.0) -> dict[str, Any]:
    base = {"ttft_p50_s": None, "cached_tokens_mean": None, "prompt_tokens_mean": None}
    tenant = {"offload": {**base, **offload}, "control": {**base, **control}, "delta_ttft_p50_s": delta,
              "delta_ttft_ci95_s": ci}
    return {"phases": {"return": {"tenants": {"acme": tenant}}},
            "upstream_metrics_delta": {"offload": {"return": {LOAD: phase_load}, "repeat": {LOAD: repeat_load}}},
            "ledger": ledger or {}}


SERVED_OFFLOAD = {"ttft_p50_s": 0.1, "cached_tokens_mean": 90.0, "prompt_tokens_mean": 100.0,
                  "offload_load_bytes": 2e6}
COLD_CONTROL = {"ttft_p50_s": 0.3, "cached_tokens_mean": 0.0, "prompt_tokens_mean": 100.0}


def test_a_served_return_is_a_yes_with_its_evidence() -> None:
    report = _report(SERVED_OFFLOAD, COLD_CONTROL, ci=[-0.25, -0.15], repeat_load=3e3,
                     ledger={"acme": {"CPU": {"stored": 12}}})
    assert tenant_verdict(report, "acme") == (
        "acme: yes, the CPU tier served the return: 90 of 100 prompt tokens cached on return with offload vs 0 on "
        f"control; {LOAD} rose by 2.00 MB over this tenant's return requests (by 3.00 kB during repeat); return "
        "TTFT p50 100 ms offload vs 300 ms control (ΔTTFT -200 ms, 95 % CI [-250, -150] ms — faster, the interval "
        "excludes 0); the ledger attributes 12 CPU-tier blocks stored to acme.")


@pytest.mark.parametrize(("ci", "direction"), [
    ([-0.25, -0.15], " — faster, the interval excludes 0"),
    ([0.1, 0.2], " — slower, the interval excludes 0"),
    ([-0.1, 0.1], " — no clear difference"),
    ([-0.1, 0.0], " — no clear difference"),  # an interval touching 0 does not exclude it
    ([0.0, 0.1], " — no clear difference"),
    (None, ""),
])
def test_the_timing_direction_follows_the_interval(ci: list[float] | None, direction: str) -> None:
    sentence = tenant_verdict(_report(SERVED_OFFLOAD, COLD_CONTROL, ci=ci), "acme")
    assert sentence.endswith(f" ms{direction}).")


def test_unknown_timings_print_as_n_a() -> None:
    sentence = tenant_verdict(_report({**SERVED_OFFLOAD, "ttft_p50_s": None}, COLD_CONTROL, delta=None), "acme")
    assert "return TTFT p50 n/a offload vs 300 ms control (ΔTTFT n/a)" in sentence


def test_phase_wide_load_bytes_are_used_when_not_measured_per_request() -> None:
    offload = {k: v for k, v in SERVED_OFFLOAD.items() if k != "offload_load_bytes"}
    sentence = tenant_verdict(_report(offload, COLD_CONTROL, phase_load=5e9), "acme")
    assert sentence.startswith("acme: yes")
    assert "rose by 5.00 GB on the offload upstream during the return phase (all tenants)" in sentence


@pytest.mark.parametrize(("offload", "control", "ledger", "reason"), [
    ({**SERVED_OFFLOAD, "cached_tokens_mean": 50.0}, {**COLD_CONTROL, "cached_tokens_mean": 50.0}, None,
     "the pressure did not evict the prefix from the GPU cache, so the return was a GPU hit on both arms"),
    ({**SERVED_OFFLOAD, "offload_load_bytes": 0.0, "cached_tokens_mean": 0.0}, COLD_CONTROL,
     {"acme": {"CPU": {"stored": 0}}}, "no block of this tenant reached the CPU tier (is its max_offload_tokens 0?)"),
    ({**SERVED_OFFLOAD, "offload_load_bytes": 0.0}, COLD_CONTROL, {"acme": {"CPU": {"stored": 4}}},
     "nothing was loaded from the CPU tier (evicted from it too, or is its max_load_tokens 0?)"),
    ({**SERVED_OFFLOAD, "cached_tokens_mean": 10.0}, {**COLD_CONTROL, "cached_tokens_mean": 10.0}, None,
     "the offload arm cached no more than the control arm"),
])
def test_each_no_names_its_reason(offload: dict[str, Any], control: dict[str, Any], ledger: dict[str, Any] | None,
                                  reason: str) -> None:
    sentence = tenant_verdict(_report(offload, control, ledger=ledger), "acme")
    assert sentence.startswith(f"acme: no, the CPU tier did not serve the return; {reason}. Evidence: ")


def test_missing_cached_figures_read_as_zero_tokens_not_a_crash() -> None:
    sentence = tenant_verdict(_report({"offload_load_bytes": 1.0}, {}), "acme")
    assert sentence.startswith("acme: no, ") and "0 of 0 prompt tokens cached" in sentence


def test_a_tenant_without_a_return_phase_is_not_measured() -> None:
    assert tenant_verdict({"phases": {}}, "acme") == "acme: not measured (no return phase for this tenant)."
    report = _report(SERVED_OFFLOAD, COLD_CONTROL)
    assert verdicts(report, ["acme", "beta"])["beta"] == "beta: not measured (no return phase for this tenant)."


# -- Markdown -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "rows", "text"), [
    (["a"], [], "| a |\n|---|"),
    (["a", "b"], [["1", "2"], ["ü", ""]], "| a | b |\n|---|---|\n| 1 | 2 |\n| ü |  |"),
])
def test_table(header: list[str], rows: list[list[str]], text: str) -> None:
    assert table(header, rows) == text


def _markdown(change: dict[str, Any] | None = None, plots: dict[str, str] | None = None) -> str:
    report = build_report(hand_run())
    for key, value in (change or {}).items():
        report[key] = value
    return render_markdown(report, plots or {"ttft_by_phase.png": "ok"})


def _section(markdown: str, heading: str) -> str:
    start = markdown.index(f"## {heading}")
    end = markdown.find("\n## ", start + 1)
    return markdown[start:] if end < 0 else markdown[start:end]


def test_the_report_opens_with_the_title_and_verdict() -> None:
    markdown = _markdown()
    lines = markdown.splitlines()
    assert lines[0] == "# Offload A/B through kvgate: hand"
    assert lines[2:5] == ["## Verdict", "", lines[4]] and lines[4].startswith("- acme: yes, the CPU tier served")


def test_the_headline_table_of_the_return() -> None:
    section = _section(_markdown(), "The return to an evicted prefix")
    assert "ΔTTFT p50 = **-200.0 ms** (95 % CI [-200.0, -200.0] ms)." in section
    assert "| offload | 100.0 | [100.0, 100.0] | 90 | 100 | 2.00 MB | 1 |" in section
    assert "| control | 300.0 | [300.0, 300.0] | 0 | 100 | 0 B | 1 |" in section


def test_phase_tables_give_each_phase_and_tenant() -> None:
    section = _section(_markdown(), "TTFT per phase")
    assert "| cold | 1000.0 | 1000.0 | 0.0 | [0.0, 0.0] | 0 | 0 | 1/1 | 0/0 |" in section
    assert "| return | acme | 100.0 | 300.0 | -200.0 | [-200.0, -200.0] | 90 | 0 |" in section


def test_overhead_lines() -> None:
    section = _section(_markdown(), "What the gateway adds")
    assert "- `x-kvgate-overhead-ms` over 4 requests: p50 1.500 ms, p99 3.940 ms, max 4.000 ms." in section
    assert "- `kvgate_overhead_seconds` mean: 1.5 ms over 4 requests." in section
    assert "cold TTFT p50 (1000.0 ms): 0.15 %" in section
    assert "| offload | return | 80.0 | 100.0 | 100.0 |" in section
    assert "| control | return | – | – | 300.0 |" in section  # unknown is a dash, never 0


def test_a_skipped_restart_and_missing_memory_are_said() -> None:
    markdown = _markdown()
    assert "Not run: no restart phase." in _section(markdown, "Restart")
    assert "No upstream PID was known, so no RSS was sampled." in _section(markdown, "Host memory")


def test_a_restart_table_from_the_restart_view() -> None:
    restart = {"restarts": [{"arm": "offload", "ok": True, "error": None, "seconds": 12.34, "pid_before": 10,
                             "pid_after": 11},
                            {"arm": "control", "ok": False, "error": "TimeoutError: late", "seconds": 300.0,
                             "pid_before": 20, "pid_after": None}],
               "ledger_observed": False, "closed_by_restart": {"acme": {"CPU": {"restart": 3, "lost": 1}}},
               "resident_before": {"acme": {"CPU": 7}}, "resident_after": {"acme": {"CPU": 2}},
               "gaps_after": [{"source": "offload/0", "missing_batches": 0, "restarts": 1, "lost": 0,
                               "closed_without_removal": 3}]}
    timeline = [{"label": "after restart", "resident": {"acme": {"CPU": 0}}}]
    section = _section(_markdown({"restart": restart, "ledger_timeline": timeline}), "Restart")
    assert "- `offload` restarted in 12.3 s (ok); PID 10 → 11" in section
    assert "- `control` restarted in 300.0 s (failed: TimeoutError: late); PID 20 → None" in section
    assert "The ledger saw the restart: NOT within the time limit." in section
    assert "| acme | CPU | 7 | 3 | 1 | 0 | 2 |" in section
    assert "| offload/0 | 0 | 1 | 0 | 3 |" in section


def test_memory_peaks_per_arm() -> None:
    points = [{"arms": {"offload": {"rss_bytes": 2e9}, "control": {"rss_bytes": 1e9}}},
              {"arms": {"offload": {"rss_bytes": 5e9}, "control": {"rss_bytes": 1.5e9}}},
              {"arms": {"offload": {"rss_bytes": 4e9}, "control": {"rss_bytes": None}}}]
    section = _section(_markdown({"memory": points}), "Host memory")
    assert "| offload | 2.00 GB | 5.00 GB | 4.00 GB |" in section
    assert "| control | 1.00 GB | 1.50 GB | 1.50 GB |" in section
    assert "peaked 3.50 GB above the control arm's" in section


def test_the_direct_baseline_line() -> None:
    report = build_report(hand_run())
    report["gateway_overhead"]["direct_vs_gateway"] = {
        "pairs": 2, "direct_ttft_p50_s": 0.15, "gateway_ttft_p50_s": 0.165, "added_ttft_p50_s": 0.015,
        "added_ttft_ci95_s": [0.01, 0.02], "share_of_direct_p50": 0.1}
    section = _section(render_markdown(report, {}), "What the gateway adds")
    assert ("End to end, 2 pairs of fresh 100-token prompts sent straight to the control upstream and through the "
            "gateway: TTFT p50 150.0 ms direct vs 165.0 ms via kvgate; paired difference p50 15.0 ms "
            "(95 % CI [10.0, 20.0] ms), 10.00 % of the direct TTFT.") in section


def test_plots_not_drawn_are_listed_with_why() -> None:
    markdown = _markdown(plots={"a.png": "ok", "b.png": "no data: nothing", "c.png": "matplotlib is not installed"})
    section = _section(markdown, "Plots not drawn")
    assert "- `b.png`: no data: nothing" in section and "- `c.png`: matplotlib is not installed" in section
    assert "a.png" not in section
    assert "Plots not drawn" not in _markdown(plots={"a.png": "ok"})


def test_how_it_ran_lists_the_environment_sorted_and_the_checks() -> None:
    report = build_report(hand_run())
    report["environment"] = {"mode": "test", "zeta": 1, "alpha": "x"}
    section = _section(render_markdown(report, {}), "How it ran")
    assert "- Scenario `hand`: 1 tenants, prefix 100 tokens, 3 pressure prompts of 8000 tokens" in section
    assert "- Mode: test; started 1970-01-01 00:01:40 UTC, took 60.0 s." in section
    assert "- Checks: 0 failed requests, 0 served by the wrong pool; pressure evicted the prefix from the GPU: True." \
        in section
    assert section.index("- alpha: `x`") < section.index("- zeta: `1`")


def test_the_description_follows_the_title() -> None:
    report = build_report(hand_run())
    scenario = copy.deepcopy(report["scenario"])
    scenario["description"] = "  Two tenants, one GPU.\n"
    report["scenario"] = scenario
    assert render_markdown(report, {}).splitlines()[2] == "Two tenants, one GPU."


def test_no_peak_comparison_when_one_arm_was_never_sampled() -> None:
    points = [{"arms": {"offload": {"rss_bytes": 2e9}, "control": {"rss_bytes": None}}}]
    section = _section(_markdown({"memory": points}), "Host memory")
    assert "| offload | 2.00 GB | 2.00 GB | 2.00 GB |" in section
    assert "| control |" not in section and "peaked" not in section
