"""`kvgate doctor` against simulators standing in for vLLM 0.25.0, 0.32.0 and a dev-mode server (GET /server_info),
a real 0.25.0 server log, and the captured 0.25.0 `/metrics` (which do not carry kv_load_failure_policy)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from gateway.cli.doctor import _failure_policy, _offload_tier
from tests.gateway.conftest import UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir
from tests.procs import free_port, kvgate_command

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0"


def test_captured_025_metrics_do_not_expose_the_failure_policy() -> None:
    metrics = (CAPTURES / "metrics" / "offload_metrics_after.txt").read_text()
    assert _failure_policy(metrics, None).startswith("unknown (not in /metrics")
    assert _offload_tier(metrics).startswith("yes")
    assert _failure_policy(None, CAPTURES / "logs" / "offload_run3.log") == "fail (server log)"
    assert _offload_tier((CAPTURES / "metrics" / "control_metrics_after.txt").read_text()) == "no"


def test_doctor_reports_each_upstream(tmp_path: Path) -> None:
    with sim_process(tmp_path, "--offload", "--ignore-max-load-tokens") as old, \
            sim_process(tmp_path, "--vllm-version", "0.32.0") as new, \
            sim_process(tmp_path, "--offload", "--server-dev-mode", "--load-failure-policy", "recompute") as dev:
        auth: dict[str, Any] = {"api_key_env": UPSTREAM_KEY_ENV}
        pools: dict[str, dict[str, Any]] = {
            "offload": {"upstreams": [old.url], **auth}, "control": {"upstreams": [new.url], **auth},
            "dev": {"upstreams": [dev.url], **auth}, "gone": {"upstreams": [f"http://127.0.0.1:{free_port()}"]}}
        policy = PolicyDir(tmp_path / "policies", pools)
        policy.add_tenant("acme", offload={"admission": "returning", "miss_path": "retry"},
                          rollout={"pool": "offload", "else_pool": "control"})
        policy.write()
        argv = kvgate_command("doctor", "--policies", str(policy.root), "--format", "json",
                              "--server-log", f"offload={CAPTURES / 'logs' / 'offload_run3.log'}")
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", UPSTREAM_KEY_ENV: UPSTREAM_KEY})
        table = subprocess.run(argv[:-4], capture_output=True, text=True, timeout=60,
                               env={"PATH": "/usr/bin:/bin", UPSTREAM_KEY_ENV: UPSTREAM_KEY})
    assert done.returncode == 1, done.stderr  # one upstream is unreachable
    reports = {report["pool"]: report for report in json.loads(done.stdout)}
    offload, control, gone = reports["offload"], reports["control"], reports["gone"]
    assert (offload["version"], offload["max_load_tokens"]) == ("0.25.0", "ignored")
    assert offload["miss_path_recompute"].startswith("salt")
    assert offload["offload_tier"].startswith("yes")
    assert offload["kv_load_failure_policy"] == "fail (server log)"
    assert any("kv_load_failure_policy" in line for line in offload["advice"])
    assert (control["version"], control["max_load_tokens"], control["offload_tier"]) == ("0.32.0", "honoured", "no")
    assert control["miss_path_recompute"].startswith("max_load_tokens")
    assert control["kv_load_failure_policy"].startswith("unknown")
    assert gone["reachable"] is False and gone["version"] is None
    dev = reports["dev"]
    assert dev["kv_load_failure_policy"] == "recompute (/server_info, dev mode)"
    assert not any("kv_load_failure_policy" in line for line in dev["advice"])
    assert "acme" in table.stdout and "returning" in table.stdout
