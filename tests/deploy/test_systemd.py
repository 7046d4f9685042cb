"""The systemd unit: `systemd-analyze verify` in a throwaway root (any stderr fails), its hardening score, the
sysusers entry, and the unit's own command lines driving a real kvgate: start, then reload on SIGHUP."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import time
from pathlib import Path

import httpx
import yaml

from gateway.keys import hash_key, new_key
from gateway.ledger.config import LedgerSettings
from tests.deploy.checks import (
    ledger_defaults,
    ledger_env_name,
    ledger_problems,
    limit_defaults,
    limit_problems,
    setting_env_names,
    systemd_problems,
    systemd_root,
    unit_entries,
)
from tests.deploy.tools import DEPLOY, REPO, output, run, system_tool
from tests.harness import bearer, new_secret
from tests.procs import free_port, run_server

UNIT = DEPLOY / "systemd" / "kvgate.service"
SYSUSERS = DEPLOY / "systemd" / "kvgate.sysusers.conf"
ENV_EXAMPLE = DEPLOY / "systemd" / "kvgate.env.example"
EXPOSURE_THRESHOLD = 20  # systemd-analyze security on a 0-100 scale: at most 2.0, "OK"


def values(key: str) -> list[str]:
    return [value for _, name, value in unit_entries(UNIT.read_text()) if name == key]


def test_verify_reports_nothing(tmp_path: Path) -> None:
    assert systemd_problems(UNIT, tmp_path / "root") == []


def test_hardening_exposure_stays_low(tmp_path: Path) -> None:
    root = systemd_root(UNIT, tmp_path / "root")
    result = run([system_tool("systemd-analyze"), "security", "--offline=true", f"--root={root}",
                  f"--threshold={EXPOSURE_THRESHOLD}", UNIT.name])
    assert result.returncode == 0, output(result)


def test_hardening_settings_the_deployment_relies_on() -> None:
    settings = {name: value for _, name, value in unit_entries(UNIT.read_text())}
    assert settings["User"] == "kvgate" and settings["Group"] == "kvgate"
    assert settings["ProtectSystem"] == "strict" and settings["NoNewPrivileges"] == "yes"
    assert settings["StateDirectory"] == "kvgate"
    assert settings["ReadOnlyPaths"] == "/etc/kvgate/policies"
    assert settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    environment = dict(entry.split("=", 1) for entry in values("Environment"))
    assert environment["KVGATE_POLICIES"] == settings["ReadOnlyPaths"]
    assert environment["KVGATE_STATE_PATH"].startswith(f"/var/lib/{settings['StateDirectory']}/")
    known = setting_env_names()
    example_names = {line.lstrip("# ").split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
                     if "=" in line and line.lstrip("# ").startswith("KVGATE_")}
    unknown = ({name for name in environment if name.startswith("KVGATE_")} | example_names) - known
    assert not unknown, f"not kvgate settings (pydantic-settings would silently ignore them): {unknown}"


def commented_settings() -> tuple[dict[str, str], dict[str, str]]:
    """The env example's commented `# KVGATE_X=default` lines (systemd ignores them), as name -> value and
    name -> the one-line comment above saying why; a setting without such a comment fails here."""
    lines = ENV_EXAMPLE.read_text().splitlines()
    commented: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for index, line in enumerate(lines):
        setting = re.fullmatch(r"# (KVGATE_[A-Z0-9_]+)=(\S*)", line)
        if setting is None:
            continue
        commented[setting[1]] = setting[2]
        reason = lines[index - 1]
        assert reason.startswith("# ") and not re.match(r"# KVGATE_[A-Z0-9_]+=", reason), f"{line}: no reason above"
        reasons[setting[1]] = reason
    return commented, reasons


def test_env_example_lists_every_limit_with_its_default_and_a_reason() -> None:
    commented, _ = commented_settings()
    assert limit_problems(commented, limit_defaults()) == []


def test_env_example_lists_every_ledger_setting_with_its_default_and_a_reason() -> None:
    """A setting unset by default shows a value kvgate accepts, and its reason says it is unset by default
    (a line left empty would be refused once uncommented)."""
    commented, reasons = commented_settings()
    defaults = ledger_defaults()
    unset = sorted(name for name, value in defaults.items() if value is None)
    assert ledger_problems(commented, {name: value for name, value in defaults.items() if value is not None}) == []
    for name in unset:
        variable = ledger_env_name(name)
        assert variable in commented, f"{variable} is missing"
        LedgerSettings.model_validate({name: commented[variable]})
        assert "unset by default" in reasons[variable], reasons[variable]


def test_sysusers_creates_the_dedicated_user(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    result = run([system_tool("systemd-sysusers"), f"--root={tmp_path}", SYSUSERS])
    assert result.returncode == 0, output(result)
    (entry,) = [line for line in (tmp_path / "etc" / "passwd").read_text().splitlines() if line.startswith("kvgate:")]
    assert entry.split(":")[5:] == ["/var/lib/kvgate", "/usr/sbin/nologin"]


def test_unit_command_lines_run_kvgate_and_reload_on_sighup(tmp_path: Path) -> None:
    """ExecStartPre, ExecStart and ExecReload as written, with the unit's Environment=, under a temporary root
    (/opt/kvgate is this checkout's venv). The periodic poll is turned off, so only SIGHUP can reload."""
    root = tmp_path / "root"
    rewrite = {"/opt/kvgate/bin/kvgate": str(REPO / ".venv" / "bin" / "kvgate"),
               "/etc/kvgate": str(root / "etc" / "kvgate"), "/var/lib/kvgate": str(root / "var" / "lib" / "kvgate")}

    def local(text: str) -> str:
        for path, replacement in rewrite.items():
            text = text.replace(path, replacement)
        return text

    policies = root / "etc" / "kvgate" / "policies"
    shutil.copytree(REPO / "policies", policies)
    admin_key = new_key()
    ops = {"tenant": "ops", "keys": [{"sha256": hash_key(admin_key), "scopes": ["admin"]}]}
    (policies / "tenants" / "ops.yaml").write_text(yaml.safe_dump(ops))
    (root / "var" / "lib" / "kvgate").mkdir(parents=True)
    port = free_port()
    env = {key: local(value) for key, value in (entry.split("=", 1) for entry in values("Environment"))}
    env |= {"KVGATE_PORT": str(port), "KVGATE_SALT_SECRET": new_secret(), "KVGATE_RELOAD_INTERVAL_S": "3600",
            "VLLM_OFFLOAD_KEY": "k1", "VLLM_CONTROL_KEY": "k2"}
    (pre,) = values("ExecStartPre")
    checked = run(shlex.split(local(pre)), env=env)
    assert checked.returncode == 0, output(checked)
    (start,) = values("ExecStart")
    with run_server(shlex.split(local(start)), port, tmp_path / "kvgate.log", env=env) as gateway:
        client = httpx.Client(base_url=gateway.url, headers=bearer(admin_key), timeout=10)
        before = client.get("/admin/policies").json()
        (policies / "tenants" / "initech.yaml").unlink()
        (reload_command,) = values("ExecReload")
        signalled = run(shlex.split(reload_command.replace("$MAINPID", str(gateway.popen.pid))))
        assert signalled.returncode == 0, output(signalled)
        deadline = time.monotonic() + 15
        while "initech" in client.get("/admin/policies").json()["tenants"]:
            assert time.monotonic() < deadline, gateway.log_text()[-3000:]
            time.sleep(0.1)  # polling the admin API until the reload shows, not synchronisation
        assert "initech" in before["tenants"] and os.path.exists(env["KVGATE_STATE_PATH"])
