"""scripts/gpu/runplan.py and vllm_server.sh's settings: what the GPU host runs for a list of scenario files.

The H200 command has one shot at its scenarios, so the plan it follows is checked here, on the real scripts run as
subprocesses: a `server:` block with a list of tier sizes expands into one run per size, command-line overrides win
over the file, defaults match the 2026-11-29 runs, and a bad block is refused before any server starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gateway.devtools.loadtest.model import load_scenario

REPO = Path(__file__).resolve().parents[2]
RUNPLAN = REPO / "scripts" / "gpu" / "runplan.py"
VLLM_SERVER = REPO / "scripts" / "gpu" / "vllm_server.sh"


def write(path: Path, **fields: object) -> Path:
    body = {"name": path.stem, "tenants": [{"name": "acme"}], **fields}
    path.write_text(yaml.safe_dump(body))
    return path


def runplan(out: Path, *entries: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, str(RUNPLAN), str(out), *entries], capture_output=True, text=True,
                          env=env, check=False)


def rows(result: subprocess.CompletedProcess[str]) -> list[list[str]]:
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()]


def test_defaults_match_the_offload_ab_servers(tmp_path: Path) -> None:
    scenario = write(tmp_path / "plain.yaml")
    [[name, copy, offload, control, fresh, runner]] = rows(runplan(tmp_path / "plan", str(scenario)))
    assert (name, offload, control, fresh, runner) == ("plain", "offloading:12000000000", "none", "reset", "loadtest")
    assert load_scenario(Path(copy)).server.offload.cpu_bytes_to_use == 12_000_000_000
    assert "-m gateway.devtools.loadtest" in (tmp_path / "plan" / "plain.run.sh").read_text()


def test_a_list_of_sizes_is_one_run_per_size_in_order(tmp_path: Path) -> None:
    scenario = write(tmp_path / "plan.yaml", server={"cpu_bytes_to_use": [4_000_000_000, 16_000_000_000]})
    plan = rows(runplan(tmp_path / "plan", str(scenario)))
    assert [(row[0], row[2]) for row in plan] == [("plan-cpu4GB", "offloading:4000000000"),
                                                  ("plan-cpu16GB", "offloading:16000000000")]
    copies = [load_scenario(Path(row[1])) for row in plan]
    assert [copy.name for copy in copies] == ["plan-cpu4GB", "plan-cpu16GB"]
    assert [copy.server.offload.cpu_bytes_to_use for copy in copies] == [4_000_000_000, 16_000_000_000]


def test_overrides_on_the_command_line_win(tmp_path: Path) -> None:
    scenario = write(tmp_path / "adm.yaml", server={"offload": {"cpu_bytes_to_use": 8_000_000_000}})
    [[_, _, offload, _, fresh, _]] = rows(runplan(tmp_path / "plan", f"{scenario}@cpu_bytes_to_use=3e9@fresh=restart"))
    assert (offload, fresh) == ("offloading:3000000000", "restart")


def test_per_arm_connectors(tmp_path: Path) -> None:
    scenario = write(tmp_path / "two.yaml", server={"offload": {"connector": "lmcache", "cpu_bytes_to_use": 5e9},
                                                    "control": {"connector": "offloading"}})
    [[_, _, offload, control, _, _]] = rows(runplan(tmp_path / "plan", str(scenario)))
    assert (offload, control) == ("lmcache:5000000000", "offloading:12000000000")


def test_other_runners_keep_their_own_fields_and_get_their_commands(tmp_path: Path) -> None:
    # a hot-plus-scan file has fields the loadtest model would refuse; only its server block is checked
    scenario = tmp_path / "adm.yaml"
    scenario.write_text(yaml.safe_dump({"name": "adm", "workload": {"hot_docs": 3}, "arms": {"all": {}},
                                        "server": {"runner": "hotscan", "cpu_bytes_to_use": 2e9}}))
    [[name, copy, offload, _, _, runner]] = rows(runplan(tmp_path / "plan", str(scenario)))
    assert (name, offload, runner) == ("adm", "offloading:2000000000", "hotscan")
    assert yaml.safe_load(Path(copy).read_text())["workload"] == {"hot_docs": 3}
    run = (tmp_path / "plan" / "adm.run.sh").read_text()
    assert "-m loadtests.hotscan" in run and '--restart-cmd "$RESET_OFFLOAD"' in run


def test_runner_can_be_named_on_the_command_line(tmp_path: Path) -> None:
    scenario = tmp_path / "adm.yaml"  # a file written before the server block existed
    scenario.write_text(yaml.safe_dump({"name": "adm", "workload": {"hot_docs": 3}}))
    [[*_, runner]] = rows(runplan(tmp_path / "plan", f"{scenario}@runner=hotscan"))
    assert runner == "hotscan"


def test_reuse_files_keep_their_format_and_loop_over_their_own_sizes(tmp_path: Path) -> None:
    body = {"kind": "reuse", "name": "plan-x", "workload": {"requests": 5},
            "cpu_bytes_to_use": [6_000_000_000, 16_000_000_000]}
    scenario = tmp_path / "reuse.yaml"
    scenario.write_text(yaml.safe_dump(body))
    [[name, copy, offload, control, fresh, runner]] = rows(runplan(tmp_path / "plan", str(scenario)))
    assert (name, offload, control, fresh, runner) == ("plan-x", "offloading:6000000000", "none", "reset", "reuse")
    assert yaml.safe_load(Path(copy).read_text()) == body  # strict loaders get their file unchanged
    assert 'offload=$ENSURE_OFFLOAD' in (tmp_path / "plan" / "plan-x.run.sh").read_text()
    refused = runplan(tmp_path / "plan", f"{scenario}@fresh=keep")
    assert refused.returncode == 2 and "no @overrides" in refused.stderr


def test_explicit_runner_commands(tmp_path: Path) -> None:
    scenario = tmp_path / "own.yaml"
    scenario.write_text(yaml.safe_dump({"name": "own", "server": {"runner": {
        "write_policies": "mkdir -p $POLICIES", "run": "echo $GATEWAY > $REPORT"}}}))
    [[*_, runner]] = rows(runplan(tmp_path / "plan", str(scenario)))
    assert runner == "commands"
    assert (tmp_path / "plan" / "own.run.sh").read_text() == "echo $GATEWAY > $REPORT\n"


def test_same_file_twice_gets_distinct_names(tmp_path: Path) -> None:
    scenario = write(tmp_path / "twice.yaml")
    names = [row[0] for row in rows(runplan(tmp_path / "plan", str(scenario), str(scenario)))]
    assert names == ["twice", "twice-again"]


@pytest.mark.parametrize(("server", "problem"), [
    ({"cpu_bytes_to_use": 4e9, "offload": {"cpu_bytes_to_use": 8e9}}, "once"),
    ({"cpu_bytes_to_use": []}, "empty"),
    ({"offload": {"connector": "disk"}}, "connector"),
    ({"fresh": "sometimes"}, "fresh"),
    ({"runner": "nonesuch"}, "runner"),
])
def test_bad_server_blocks_are_refused_before_anything_runs(tmp_path: Path, server: object, problem: str) -> None:
    scenario = write(tmp_path / "bad.yaml", server=server)
    result = runplan(tmp_path / "plan", str(scenario))
    assert result.returncode == 2
    assert problem in result.stderr and "bad.yaml" in result.stderr
    assert result.stdout == ""


def test_unknown_override_is_refused(tmp_path: Path) -> None:
    result = runplan(tmp_path / "plan", f"{write(tmp_path / 'x.yaml')}@cpu=4e9")
    assert result.returncode == 2 and "unknown override" in result.stderr


def setting(kvg: Path, arm: str, **env: str) -> str:
    result = subprocess.run(["bash", str(VLLM_SERVER), "setting", arm], capture_output=True, text=True, check=True,
                            env={**os.environ, "KVG": str(kvg), **env})
    return result.stdout.strip()


def test_server_setting_defaults_then_sticks(tmp_path: Path) -> None:
    assert setting(tmp_path, "offload") == "offloading:12000000000"
    assert setting(tmp_path, "control") == "none"
    (tmp_path / "offload.setting").write_text("lmcache:4000000000\n")  # what `start` records for a later restart
    assert setting(tmp_path, "offload") == "lmcache:4000000000"
    assert setting(tmp_path, "offload", SETTING="offloading:1") == "offloading:1"
    assert setting(tmp_path, "offload", CPU_BYTES="6000000000") == "offloading:6000000000"  # a reuse runner's restart
    assert setting(tmp_path, "control", CPU_BYTES="6000000000") == "none"
