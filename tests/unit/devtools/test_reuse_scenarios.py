"""Reuse scenarios (`kind: reuse`, gateway.devtools.loadtest.reuse and .workload_run): the file format, the
policy directory they write (checked by the real policy loader), the measured shares, and the predicted-vs-
measured comparison and its table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.devtools.loadtest.model import ScenarioError
from gateway.devtools.loadtest.reuse import (
    ReuseScenario,
    compare,
    is_reuse_file,
    load_reuse_scenario,
    render_markdown,
    save,
    write_reuse_policies,
)
from gateway.devtools.loadtest.workload_run import WorkloadResult
from gateway.keys import hash_key
from gateway.policy.loader import load_policy_set

SCENARIOS = Path(__file__).resolve().parents[3] / "loadtests" / "scenarios"
MINIMAL: dict[str, Any] = {"kind": "reuse", "name": "r", "workload": {"shape": {"kind": "zipf"}},
                           "cpu_bytes_to_use": [1000]}
GPU, CPU, PROMPT = "vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total", "vllm:prompt_tokens_total"
LOAD = "vllm:kv_offload_load_bytes_total"


def _write(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "reuse.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.mark.parametrize("name", ["plan-sim.yaml", "plan-h200.yaml"])
def test_shipped_reuse_scenarios_load(name: str) -> None:
    assert is_reuse_file(SCENARIOS / name)
    scenario = load_reuse_scenario(SCENARIOS / name)
    assert scenario.kind == "reuse" and scenario.cpu_bytes_to_use


@pytest.mark.parametrize(("content", "reuse"), [
    (MINIMAL, True), ({**MINIMAL, "kind": "ab"}, False), ({"name": "x"}, False), ("- a\n", False),
    ("kind: [broken\n", False), ("", False),
])
def test_is_reuse_file(tmp_path: Path, content: Any, reuse: bool) -> None:
    assert is_reuse_file(_write(tmp_path, content)) is reuse


def test_an_absent_file_is_not_a_reuse_file(tmp_path: Path) -> None:
    assert not is_reuse_file(tmp_path / "absent.yaml")


@pytest.mark.parametrize(("change", "field"), [
    ({"kind": "reusable"}, "kind"), ({"cpu_bytes_to_use": []}, "cpu_bytes_to_use"), ({"tolerance": 0}, "tolerance"),
    ({"max_tokens": 0}, "max_tokens"), ({"workload": {"shape": {"kind": "nope"}}}, "workload"),
    ({"extra": 1}, "extra"), ({"sim": {"gpu_blocks": 0}}, "gpu_blocks"),
    ({"tenant": "Acme Corp"}, "is not a tenant name a policy accepts"),
])
def test_invalid_reuse_scenarios_name_the_file_and_field(tmp_path: Path, change: dict[str, Any], field: str) -> None:
    path = _write(tmp_path, {**MINIMAL, **change})
    with pytest.raises(ScenarioError) as raised:
        load_reuse_scenario(path)
    assert str(raised.value).startswith(f"{path}: ") and field in str(raised.value)


def test_the_written_policy_directory_loads_and_its_keys_match(tmp_path: Path) -> None:
    scenario = ReuseScenario.model_validate({**MINIMAL, "tenant": "tenant-2", "pool": "tiered"})
    access = write_reuse_policies(tmp_path / "policies", scenario, "http://127.0.0.1:9")
    policies = load_policy_set(tmp_path / "policies")
    assert policies.gateway.default_pool == "tiered"
    assert policies.gateway.pools["tiered"].upstreams == ["http://127.0.0.1:9"]
    tenant = yaml.safe_load((tmp_path / "policies" / "tenants" / "tenant-2.yaml").read_text())
    scopes = {entry["sha256"]: entry["scopes"] for entry in tenant["keys"]}
    assert scopes == {hash_key(access.tenants["tenant-2"].key): ["inference"],
                      hash_key(access.admin_key): ["admin", "metrics"]}
    assert access.admin_key != access.tenants["tenant-2"].key


def _result(delta: dict[str, float] | None = None, usage: tuple[int, int] = (0, 0)) -> WorkloadResult:
    result = WorkloadResult(started_at=0.0, upstream_delta=delta or {})
    result.usage_prompt_tokens, result.usage_cached_tokens = usage
    return result


@pytest.mark.parametrize(("delta", "usage", "shares"), [
    ({GPU: 300.0, CPU: 100.0, PROMPT: 1000.0}, (0, 0), (0.3, 0.1, None)),
    ({GPU: 300.0, CPU: 100.0, PROMPT: 0.0}, (500, 250), (0.6, 0.2, 0.5)),  # no prompt counter: usage's count
    ({GPU: 300.0, PROMPT: 1000.0}, (0, 0), (0.3, None, None)),  # no connector counter: unknown, not 0
    ({}, (0, 0), (None, None, None)),
])
def test_measured_shares(delta: dict[str, float], usage: tuple[int, int],
                         shares: tuple[float | None, float | None, float | None]) -> None:
    result = _result(delta, usage)
    assert (result.gpu_share, result.cpu_share, result.usage_cached_share) == shares
    assert result.to_json()["gpu_share"] == shares[0]


def _plan(gpu: float = 0.3, cpu: float = 0.1, per_token: float | None = 100.0) -> dict[str, Any]:
    return {"evaluated": [{"gpu_share": gpu, "cpu_share": cpu, "error_bound": {"cpu_share": 0.01}}],
            "kv": {"bytes_per_token": 50.0, "server_bytes_per_token": 50.0, "bytes_per_token_all_ranks": per_token}}


@pytest.mark.parametrize(("predicted", "tolerance", "match"), [
    ((0.25, 0.125), 0.03, True), ((0.27, 0.125), 0.03, True), ((0.25, 0.1), 0.03, True),
    ((0.5, 0.125), 0.25, True),  # exactly the tolerance apart (exact in binary): still a match
    ((0.5, 0.125), 0.2499, False), ((0.29, 0.125), 0.03, False), ((0.25, 0.2), 0.03, False),
])
def test_a_match_is_every_share_within_the_tolerance(predicted: tuple[float, float], tolerance: float,
                                                      match: bool) -> None:
    measured = _result({GPU: 250.0, CPU: 125.0, PROMPT: 1000.0})
    comparison = compare(_plan(*predicted), measured, tolerance)
    assert comparison["match"] is match
    assert comparison["difference"]["gpu_share"] == pytest.approx(predicted[0] - 0.25)


def test_an_unknown_measured_share_is_no_match() -> None:
    comparison = compare(_plan(), _result({GPU: 300.0, PROMPT: 1000.0}), 0.5)
    assert comparison["difference"]["cpu_share"] is None and comparison["match"] is False


def test_no_prediction_is_said_not_guessed() -> None:
    comparison = compare({"evaluated": []}, _result({GPU: 1.0, PROMPT: 2.0}), 0.03)
    assert comparison["match"] is None and comparison["predicted"] is None
    assert comparison["why"] == "the plan made no prediction (see its warnings)"
    assert compare({}, _result(), 0.03)["match"] is None


@pytest.mark.parametrize(("load", "per_token", "share"), [
    (20_000.0, 100.0, 0.2),  # 20 kB / 100 B a token = 200 tokens of 1000
    (0.0, 100.0, None), (20_000.0, None, None), (20_000.0, 0.0, None),
])
def test_the_load_bytes_cross_check(load: float, per_token: float | None, share: float | None) -> None:
    measured = _result({GPU: 300.0, CPU: 100.0, PROMPT: 1000.0, LOAD: load})
    assert compare(_plan(per_token=per_token), measured, 0.03)["cpu_share_from_load_bytes"] == share


def _report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"scenario": {"name": "plan-sim", "description": " Zipf docs. ", "tolerance": 0.03}, "runs": runs}


def test_the_markdown_table_puts_predicted_and_measured_side_by_side() -> None:
    measured = _result({GPU: 300.0, CPU: 100.0, PROMPT: 1000.0, LOAD: 20_000.0}, (1000, 400))
    plan = _plan(0.31, 0.09)
    run = {"cpu_bytes_to_use": 12_000_000_000, "measured": measured.to_json(), "plan": plan,
           "comparison": compare(plan, measured, 0.03)}
    text = render_markdown(_report([run]))
    lines = text.splitlines()
    assert lines[0] == "# plan-sim: predicted vs measured token shares"
    assert lines[2] == "Zipf docs."
    assert "| 12,000,000,000 | 31.0 % | 30.0 % | 9.0 % | 10.0 % | 20.0 % | 40.0 % | True |" in lines
    assert "Tolerance: 3 percentage points." in text
    assert text.endswith("KV bytes per token: plan 50.0, server 50.0 (`vllm:cache_config_info`).\n")


def test_unknown_shares_print_as_unknown(tmp_path: Path) -> None:
    measured = _result()
    run = {"cpu_bytes_to_use": 1000, "measured": measured.to_json(), "plan": {"kv": {}},
           "comparison": compare({}, measured, 0.03)}
    report = _report([run])
    text = render_markdown(report)
    assert "| 1,000 | unknown | unknown | unknown | unknown | unknown | unknown | None |" in text
    assert "KV bytes per token: plan" not in text  # the plan said nothing about it
    save(report, tmp_path / "out")
    assert (tmp_path / "out" / "report.md").read_text() == text
    assert '"cpu_bytes_to_use": 1000' in (tmp_path / "out" / "report.json").read_text()
