"""`kvgate loadtest` without traffic (gateway.devtools.loadtest.cli and .args): flags that do not fit together,
--write-policies for both scenario kinds, --render of a saved report, and the targets built from flags."""

from __future__ import annotations

import argparse
import json
import stat
from pathlib import Path

import pytest
import yaml

from gateway.cli.main import main
from gateway.devtools.loadtest.args import add_arguments
from gateway.devtools.loadtest.cli import UsageError, external_targets
from gateway.devtools.loadtest.summary import build_report
from gateway.devtools.loadtest.targets import Access, CommandRestart, FixedPid, PidFile, TenantAccess
from gateway.policy.loader import load_policy_set
from tests.unit.devtools.runs import hand_run

SCENARIOS = Path(__file__).resolve().parents[3] / "loadtests" / "scenarios"


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["loadtest", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvgate loadtest: ")
    return err


@pytest.mark.parametrize(("argv", "message"), [
    (["--upstream", "offload=http://127.0.0.1:1"], "describe an existing stack: add --gateway"),
    (["--pid", "offload=5"], "describe an existing stack: add --gateway"),
    (["--gateway", "http://127.0.0.1:1"], "--gateway needs --access keys.json"),
    (["--write-policies", "{tmp}/p", "--upstream", "offload=http://a"], "needs --upstream for both arms"),
    (["--write-policies", "{tmp}/p", "--upstream", "offload=http://a", "--upstream", "control=http://b",
      "--upstream", "third=http://c"], "--upstream: unknown arm 'third' (the arms are offload, control)"),
    (["--write-policies", "{tmp}/p", "--upstream", "offload=http://a", "--upstream", "control=http://b",
      "--kv-events", "nowhere=tcp://x"], "--kv-events: unknown arm 'nowhere'"),
    (["{tmp}/absent.yaml"], "cannot read"),
    (["--render", "{tmp}"], "report.json"),
])
def test_flags_that_do_not_fit_exit_1_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], message: str) -> None:
    err = _fails(capsys, *[arg.format(tmp=tmp_path) for arg in argv])
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("bad", ["offload", "=http://a", "offload=", ""])
def test_a_pair_without_arm_and_value_is_a_usage_error(capsys: pytest.CaptureFixture[str], bad: str) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["loadtest", "--upstream", bad])
    assert exited.value.code == 2
    assert f"expected ARM=VALUE, got {bad!r}" in capsys.readouterr().err


def test_a_scenario_with_problems_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "tenants": [], "phases": ["return"]}))
    err = _fails(capsys, str(path))
    assert f"{path}: tenants: " in err and "'return' needs 'pressure' before it" in err


def test_write_policies_for_the_ab_protocol(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "policies"
    assert main(["loadtest", "--write-policies", str(out), "--upstream", "offload=http://127.0.0.1:8001",
                 "--upstream", "control=http://127.0.0.1:8002", "--kv-events", "offload=tcp://127.0.0.1:5557",
                 "--kv-events", "offload=tcp://127.0.0.1:5558"]) == 0
    assert "keys.json (plain keys: keep it private)" in capsys.readouterr().out
    policies = load_policy_set(out)
    assert policies.gateway.pools["offload"].upstreams == ["http://127.0.0.1:8001"]
    assert len(policies.gateway.pools["offload"].kv_events) == 2 and not policies.gateway.pools["control"].kv_events
    assert stat.S_IMODE((out / "keys.json").stat().st_mode) == 0o600
    access = Access.load(out / "keys.json")
    assert set(access.tenants) == set(policies.tenants)
    assert all(set(entry.users) == {"offload", "control"} for entry in access.tenants.values())


def test_write_policies_for_a_reuse_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "policies"
    scenario = str(SCENARIOS / "plan-sim.yaml")
    err = _fails(capsys, scenario, "--write-policies", str(out))
    assert "--write-policies needs --upstream offload=URL" in err
    assert main(["loadtest", scenario, "--write-policies", str(out), "--upstream", "offload=http://127.0.0.1:8001"]) \
        == 0
    policies = load_policy_set(out)
    assert list(policies.gateway.pools) == ["offload"] and list(policies.tenants) == ["acme"]
    assert set(Access.load(out / "keys.json").tenants) == {"acme"}


def test_a_reuse_scenario_against_a_given_gateway_needs_its_keys(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    err = _fails(capsys, str(SCENARIOS / "plan-sim.yaml"), "--gateway", "http://127.0.0.1:1", "--out",
                 str(tmp_path / "out"))
    assert "--gateway needs --access keys.json and --upstream offload=URL" in err


def test_render_redraws_the_markdown_of_a_saved_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "report.json").write_text(json.dumps(build_report(hand_run()), default=str))
    assert main(["loadtest", "--render", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"redrew {tmp_path / 'report.md'} and ")
    markdown = (tmp_path / "report.md").read_text()
    assert markdown.startswith("# Offload A/B through kvgate: hand\n")
    assert (tmp_path / "ttft_by_phase.png").read_bytes()[:4] == b"\x89PNG"


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_external_targets_from_flags(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    Access("adm", {"acme": TenantAccess("k", {"offload": "u1", "control": "u0"})}).save(keys)
    args = _parsed("--gateway", "http://gw:8080/", "--access", str(keys), "--upstream", "offload=http://a:1/",
                   "--pid", "offload=42", "--pid-file", "offload=/run/offload.pid", "--pid", "control=7",
                   "--restart-cmd", "control=systemctl restart vllm")
    targets = external_targets(args)
    assert targets.gateway_url == "http://gw:8080" and targets.access.admin_key == "adm"
    offload, control = targets.upstreams["offload"], targets.upstreams["control"]
    assert (offload.url, control.url) == ("http://a:1", None)
    assert offload.pid_source == PidFile(Path("/run/offload.pid"))  # a PID file wins over a fixed PID
    assert control.pid_source == FixedPid(7)
    assert (offload.restart_hook, control.restart_hook) == (None, CommandRestart("systemctl restart vllm"))


def test_external_targets_refuse_unknown_arms(tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    Access("adm", {}).save(keys)
    with pytest.raises(UsageError, match="--restart-cmd: unknown arm 'both'"):
        external_targets(_parsed("--gateway", "http://gw", "--access", str(keys), "--restart-cmd", "both=x"))
