"""Scenario files of `kvgate loadtest` (gateway.devtools.loadtest.model and .server): what loads, what is refused
and with which message, defaults, the phase order, the pressure arithmetic and the GPU host's `server:` block."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.devtools.loadtest.model import PHASE_ORDER, Scenario, ScenarioError, TenantSpec, load_scenario
from gateway.devtools.loadtest.server import ArmServer, RunnerCommands, ServerSpec, arm_setting

ROOT = Path(__file__).resolve().parents[3]
AB_SCENARIOS = [ROOT / "gateway" / "devtools" / "loadtest" / "scenarios" / "default.yaml",
                *(ROOT / "loadtests" / "scenarios" / f"{name}.yaml" for name in ("ci-sim", "sim-offload-ab",
                                                                                  "h200-offload-ab"))]
MINIMAL: dict[str, Any] = {"name": "t", "tenants": [{"name": "acme"}]}


def _write(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    return path


@pytest.mark.parametrize("path", AB_SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_ab_scenario_loads(path: Path) -> None:
    assert load_scenario(path).tenants


def test_a_minimal_scenario_gets_the_documented_defaults(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, MINIMAL))
    assert scenario.tenant_names == ["acme"]
    assert (scenario.pool("offload"), scenario.pool("control")) == ("offload", "control")
    assert scenario.phases == list(PHASE_ORDER)
    assert (scenario.prefix_tokens, scenario.max_tokens, scenario.repetitions, scenario.warmup_repetitions,
            scenario.concurrency, scenario.overhead_pairs) == (8000, 4, 3, 1, 1, 0)
    assert scenario.pressure.prompts == "auto" and scenario.pressure.tokens == 8000
    assert scenario.timeouts.request_s == 120.0 and scenario.server.runner == "loadtest"


def _problem(tmp_path: Path, content: Any) -> str:
    with pytest.raises(ScenarioError) as raised:
        load_scenario(_write(tmp_path, content))
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 'scenario.yaml'}: ")
    return message


@pytest.mark.parametrize(("change", "where", "what"), [
    ({"tenants": []}, "tenants", "at least 1 item"),
    ({"tenants": [{"name": "a"}, {"name": "a"}]}, "(top)", "tenant names must be distinct"),
    ({"tenants": [{"name": "a", "polcy": {}}]}, "tenants.0.polcy", "Extra inputs are not permitted"),
    ({"arms": {"offload": {"pool": "p"}}}, "arms", "needs exactly the arms ['offload', 'control'], got ['offload']"),
    ({"arms": {"offload": {"pool": "p"}, "control": {"pool": "p"}}}, "arms", "the two arms must use different pools"),
    ({"arms": {"offload": {"pool": "a"}, "control": {"pool": "b"}, "third": {"pool": "c"}}}, "arms",
     "needs exactly the arms"),
    ({"phases": ["cold", "cold"]}, "phases", "a phase is listed twice"),
    ({"phases": ["cold", "return"]}, "phases", "'return' needs 'pressure' before it"),
    ({"phases": ["warm"]}, "phases.0", "Input should be 'cold', 'repeat', 'pressure', 'return' or 'restart'"),
    ({"prefix_tokens": 1}, "prefix_tokens", "greater than 1"),
    ({"max_tokens": 0}, "max_tokens", "greater than 0"),
    ({"repetitions": 0}, "repetitions", "greater than or equal to 1"),
    ({"warmup_repetitions": -1}, "warmup_repetitions", "greater than or equal to 0"),
    ({"concurrency": 0}, "concurrency", "greater than or equal to 1"),
    ({"vocab_size": 16}, "vocab_size", "greater than 16"),
    ({"pressure": {"tokens": 0}}, "pressure.tokens", "greater than 0"),
    ({"pressure": {"prompts": "many"}}, "pressure.prompts.literal['auto']", "Input should be 'auto'"),
    ({"timeouts": {"request_s": 0}}, "timeouts.request_s", "greater than 0"),
    ({"sim": {"gpu_blocks": 0}}, "sim.gpu_blocks", "greater than 0"),
    ({"colour": "blue"}, "colour", "Extra inputs are not permitted"),
    ({"server": {"fresh": "wipe"}}, "server.fresh", "Input should be 'reset', 'restart' or 'keep'"),
])
def test_each_invalid_field_is_named_with_its_problem(tmp_path: Path, change: dict[str, Any], where: str,
                                                      what: str) -> None:
    message = _problem(tmp_path, {**MINIMAL, **change})
    assert f"{where}: " in message and what in message


def test_several_problems_are_reported_together(tmp_path: Path) -> None:
    message = _problem(tmp_path, {"tenants": [], "max_tokens": 0, "colour": 1})
    assert "name: Field required" in message and "tenants: " in message and "max_tokens: " in message
    assert message.count("; ") >= 3


@pytest.mark.parametrize(("content", "what"), [
    ("- just\n- a list\n", "expected a mapping at the top level"),
    ("42\n", "expected a mapping at the top level"),
    ("", "expected a mapping at the top level"),
    ("name: [unclosed\n", "cannot read"),
])
def test_files_that_are_not_a_mapping_are_refused(tmp_path: Path, content: str, what: str) -> None:
    assert what in _problem(tmp_path, content)


def test_a_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.yaml")


@pytest.mark.parametrize("name", ["Café", "ACME", "unattributed", "-x", "a" * 64, "", "acme corp", "東京"])
def test_tenant_names_a_policy_would_refuse_are_refused_here(tmp_path: Path, name: str) -> None:
    """The scenario writes its tenants' policy files: a name the policy loader refuses must fail here, early."""
    message = _problem(tmp_path, {**MINIMAL, "tenants": [{"name": name}]})
    assert "tenants.0.name: " in message and "is not a tenant name a policy accepts" in message


@pytest.mark.parametrize("name", ["a" * 63, "acme_2", "0day", "a-b"])
def test_tenant_names_a_policy_accepts_load(tmp_path: Path, name: str) -> None:
    assert load_scenario(_write(tmp_path, {**MINIMAL, "tenants": [{"name": name}]})).tenant_names == [name]


def test_phases_are_put_in_protocol_order(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, {**MINIMAL, "phases": ["restart", "return", "cold", "pressure"]}))
    assert scenario.phases == ["cold", "pressure", "return", "restart"]


def test_arms_are_kept_in_protocol_order_and_found_by_pool(tmp_path: Path) -> None:
    arms = {"control": {"pool": "plain"}, "offload": {"pool": "cpu-tier"}}
    scenario = load_scenario(_write(tmp_path, {**MINIMAL, "arms": arms}))
    assert list(scenario.arms) == ["offload", "control"]
    assert (scenario.arm_of_pool("cpu-tier"), scenario.arm_of_pool("plain"), scenario.arm_of_pool("x")) == \
        ("offload", "control", None)


@pytest.mark.parametrize(("pressure", "kv_tokens", "prompts"), [
    ({}, 20336, 4),  # ceil(20336 / 8000) + 1
    ({}, 16000, 3),  # exactly two prompts fill it: one more overflows it
    ({}, 16001, 4),
    ({}, None, 4),  # unknown cache size: 4
    ({"min_prompts": 9}, 20336, 9),
    ({"min_prompts": 9}, None, 9),
    ({"prompts": 2}, 20336, 2),  # a fixed count ignores the cache size
    ({"prompts": 2, "min_prompts": 5}, None, 5),
    ({"tokens": 1000}, 20336, 22),
    ({}, 1, 2),
])
def test_pressure_prompts(pressure: dict[str, Any], kv_tokens: int | None, prompts: int) -> None:
    scenario = Scenario.model_validate({**MINIMAL, "pressure": pressure})
    assert scenario.pressure_prompts(kv_tokens) == prompts


def test_scenarios_are_frozen() -> None:
    scenario = Scenario(name="t", tenants=[TenantSpec(name="acme")])
    with pytest.raises(ValidationError):
        scenario.name = "other"


# -- the server: block ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "sizes"), [
    ({}, [None]),
    ({"cpu_bytes_to_use": 5}, [5]),
    ({"cpu_bytes_to_use": [1, 2, 3]}, [1, 2, 3]),
    ({"offload": {"cpu_bytes_to_use": 7}}, [7]),
])
def test_offload_sizes_one_per_run(spec: dict[str, Any], sizes: list[int | None]) -> None:
    assert ServerSpec.model_validate(spec).offload_sizes() == sizes


@pytest.mark.parametrize(("spec", "what"), [
    ({"cpu_bytes_to_use": 5, "offload": {"cpu_bytes_to_use": 7}}, "give the offload arm's tier size once"),
    ({"cpu_bytes_to_use": []}, "an empty list"),
    ({"cpu_bytes_to_use": [1, 0]}, "must be positive"),
    ({"cpu_bytes_to_use": -1}, "must be positive"),
    ({"cpu_bytes_to_use": 0}, "must be positive"),
    ({"offload": {"cpu_bytes_to_use": 0}}, "greater than 0"),
    ({"offload": {"connector": "nvme"}}, "Input should be 'offloading', 'lmcache' or 'none'"),
    ({"runner": {"run": "x"}}, "write_policies"),
    ({"runner": {"write_policies": "", "run": "x"}}, "at least 1 character"),
])
def test_server_block_refusals(spec: dict[str, Any], what: str) -> None:
    with pytest.raises(ValidationError, match=what):
        ServerSpec.model_validate(spec)


def test_explicit_runner_commands_are_kept() -> None:
    spec = ServerSpec.model_validate({"runner": {"write_policies": "make policies", "run": "make run"}})
    assert spec.runner == RunnerCommands(write_policies="make policies", run="make run")


@pytest.mark.parametrize(("spec", "arm", "size", "setting"), [
    (ServerSpec(), "offload", None, "offloading:12000000000"),
    (ServerSpec(), "offload", 5, "offloading:5"),
    (ServerSpec(), "control", 5, "none"),  # the control arm never takes the offload arm's size
    (ServerSpec(offload=ArmServer(connector="lmcache")), "offload", None, "lmcache:12000000000"),
    (ServerSpec(offload=ArmServer(connector="none")), "offload", 5, "none"),
    (ServerSpec(control=ArmServer(connector="offloading")), "control", None, "offloading:12000000000"),
    (ServerSpec(control=ArmServer(connector="lmcache", cpu_bytes_to_use=9)), "control", 5, "lmcache:9"),
])
def test_arm_setting_is_what_the_server_script_reads(spec: ServerSpec, arm: str, size: int | None,
                                                     setting: str) -> None:
    assert arm_setting(spec, arm, size) == setting
