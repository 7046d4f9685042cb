"""Offload admission on the hot-plus-scan workload, through a served gateway in front of simulators.

A hot set H of three 1,024-token documents returns every round; one-off documents arrive at 10x H's volume;
the CPU tier holds 2x H. With `admission: all` the one-offs flush the tier before each hot return; with
`returning` they are never stored and the hot set stays. The share is read from the simulators' own records of
CPU-loaded tokens per request (not from timing). TTFT is a speed figure: it is in
loadtests/reports/admission-sim-2026-12-01/, not asserted here.

Then load failures are injected (`--fail-loads 0.5`, vLLM's `fail` policy): with `miss_path: retry` no client
sees one, and every failed load is one counted retry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from loadtests.hotscan.cli import ARMS, Scenario, run_arms, self_started
from loadtests.hotscan.workload import HotScan

WORKLOAD = HotScan(hot_docs=3, doc_tokens=1024, scan_ratio=10, rounds=4, question_tokens=16)
FAST = ["--decode-ms-per-token", "0", "--prefill-us-per-token", "2", "--load-us-per-token", "0.5"]
SIM = {"gpu_blocks": 128, "cpu_bytes_to_use": 2 * WORKLOAD.hot_tokens * 147456, "args": FAST}
RETURNING = {"mode": "returning", "window_s": 3600, "min_seen": 1}


def scenario(returning_offload: dict[str, object], sim_args: list[str]) -> Scenario:
    arms: dict[str, dict[str, Any]] = {"all": {"offload": {"admission": "all"}},
                                       "returning": {"offload": returning_offload}}
    return Scenario("admission-test", "m", WORKLOAD, 1, arms, {**SIM, "args": sim_args})


def test_returning_admission_keeps_the_hot_set_in_the_cpu_tier(tmp_path: Path) -> None:
    plan = scenario({"admission": RETURNING}, FAST)
    with self_started(plan, tmp_path) as (gateway, keys, upstreams):
        summaries, _, _ = run_arms(plan, gateway, keys, upstreams, True, None)
    by_arm = {summary.name: summary for summary in summaries}
    assert [summary.errors for summary in summaries] == [0, 0]
    all_share, returning_share = by_arm["all"].hot_cpu_hit_share, by_arm["returning"].hot_cpu_hit_share
    assert all_share is not None and returning_share is not None
    assert returning_share >= 2 * all_share
    assert returning_share >= 0.5  # stored on its second visit, loaded from the CPU tier on every later one
    # The one-offs never reached the tier: far fewer bytes stored.
    stored = {arm: by_arm[arm].upstream_delta["vllm:kv_offload_store_bytes_total"] for arm in ARMS}
    assert stored["returning"] * 5 < stored["all"]


def test_injected_load_failures_never_reach_the_client_and_each_is_counted(tmp_path: Path) -> None:
    plan = scenario({"admission": RETURNING, "miss_path": "retry"}, [*FAST, "--fail-loads", "0.5", "--seed", "7"])
    with self_started(plan, tmp_path) as (gateway, keys, upstreams):
        summaries, answers, _ = run_arms(plan, gateway, keys, upstreams, True, None)
        failures = {arm: httpx.get(f"{url}/sim/state", timeout=10).json()["load_failures"]
                    for arm, url in upstreams.items()}
    assert failures["returning"] > 0
    assert all(answer.status == 200 and answer.error is None for answer in answers["returning"])
    counters = summaries[1].gateway_counters
    retried = sum(value for key, value in counters.items() if key.startswith("kvgate_miss_path_total"))
    recovered = sum(value for key, value in counters.items()
                    if key.startswith("kvgate_miss_path_total") and 'result="ok"' in key)
    assert retried == recovered == failures["returning"]  # one retry per failed load, each one answered


def test_the_shipped_scenarios_are_sized_as_documented() -> None:
    scenarios = Path(__file__).resolve().parents[2] / "loadtests" / "scenarios"
    for name, tier_tokens in (("admission-sim.yaml", None), ("admission-h200.yaml", 12_000_000_000 // 147456)):
        plan = Scenario.load(scenarios / name)
        spec = plan.workload
        assert spec.scan_ratio == 10
        tokens = tier_tokens or int(plan.sim["cpu_bytes_to_use"]) // 147456
        assert 1.9 <= tokens / spec.hot_tokens <= 2.1, name  # the CPU tier holds about 2x the hot set
        # Between two returns of a hot document, the one-offs alone overflow the tier.
        assert spec.scan_ratio * spec.hot_docs * spec.doc_tokens > tokens
