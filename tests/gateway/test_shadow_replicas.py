"""Shadow state across replicas and the `kvgate shadow report` command.

Two gateway replicas sharing one real redis-server produce one report; with the embedded store, the CLI
reads the same SQLite file the gateway wrote, including results still batched in memory at shutdown.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.ledger.redis_proc import RedisProcess
from tests.procs import ServerProcess, clean_environment, kvgate_command


def ab_policy(root: Path, sim: ServerProcess) -> PolicyDir:
    pools = {name: {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV} for name in ("offload", "control")}
    policy = PolicyDir(root, pools)
    policy.add_tenant("ab", shadow={"pool": "control", "sample": 1.0, "max_in_flight": 8})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    return policy


def send(gateway: ServerProcess, key: str, prompt: str) -> None:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 3, "temperature": 0}
    assert httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=30).status_code == 200


def wait_pairs(gateway: ServerProcess, admin: str, expected: int) -> dict[str, Any]:
    deadline = time.monotonic() + 30
    while True:
        report: dict[str, Any] = httpx.get(f"{gateway.url}/admin/shadow", headers=bearer(admin), timeout=30).json()
        if report["tenants"]["ab"]["pairs"] >= expected or time.monotonic() > deadline:
            return report
        time.sleep(0.05)  # polling until the shadows have settled


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis").start()
    yield server
    server.stop()


def test_two_replicas_share_one_report(sim: ServerProcess, redis_server: RedisProcess, tmp_path: Path) -> None:
    policy = ab_policy(tmp_path / "policies", sim)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_REDIS_URL": redis_server.url}
    secret = new_secret()
    with ExitStack() as stack:
        replicas = [stack.enter_context(run_gateway(policy.root, tmp_path / f"gw{n}.log", secret, env))
                    for n in range(2)]
        for index in range(6):
            send(replicas[index % 2], policy.keys["ab"], f"replicated {index}")
        wait_pairs(replicas[0], policy.keys["root"], 6)
        reports = [wait_pairs(replica, policy.keys["root"], 6)["tenants"]["ab"] for replica in replicas]
    assert reports[0]["pairs"] == reports[1]["pairs"] == 6
    assert reports[0]["compared_outputs"] == 6


def test_cli_report_reads_the_embedded_store(sim: ServerProcess, tmp_path: Path) -> None:
    policy = ab_policy(tmp_path / "policies", sim)
    state = tmp_path / "state.sqlite3"
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_STATE_PATH": str(state)}
    with run_gateway(policy.root, tmp_path / "gw.log", new_secret(), env) as gateway:
        for index in range(3):
            send(gateway, policy.keys["ab"], f"cli {index}")
        wait_pairs(gateway, policy.keys["root"], 3)
    cli_env = clean_environment({"KVGATE_STATE_PATH": str(state)})
    as_json = subprocess.run(kvgate_command("shadow", "report", "--policies", str(policy.root), "--format", "json"),
                             capture_output=True, text=True, env=cli_env, check=True, timeout=60)
    report = json.loads(as_json.stdout)["tenants"]
    assert report["ab"]["pairs"] == 3
    assert report["root"]["pairs"] == 0
    as_table = subprocess.run(kvgate_command("shadow", "report", "--policies", str(policy.root)),
                              capture_output=True, text=True, env=cli_env, check=True, timeout=60)
    assert "too few pairs to conclude" in as_table.stdout


def compared_count(gateway: ServerProcess, key: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(key), timeout=10).text
    line = next(line for line in text.splitlines()
                if line.startswith("kvgate_shadow_requests_total{") and 'outcome="compared"' in line
                and 'tenant="ab"' in line)
    return float(line.rsplit(" ", 1)[1])


def test_results_batched_in_memory_are_written_at_shutdown(sim: ServerProcess, tmp_path: Path) -> None:
    policy = ab_policy(tmp_path / "policies", sim)
    state = tmp_path / "state.sqlite3"
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_STATE_PATH": str(state), "KVGATE_SHADOW_FLUSH_INTERVAL_S": "3600"}
    with run_gateway(policy.root, tmp_path / "gw.log", new_secret(), env) as gateway:
        for index in range(4):
            send(gateway, policy.keys["ab"], f"held {index}")
        deadline = time.monotonic() + 30
        while compared_count(gateway, policy.keys["root"]) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)  # polling until every shadow has settled into the recorder
        assert compared_count(gateway, policy.keys["root"]) == 4
    cli_env = clean_environment({"KVGATE_STATE_PATH": str(state)})
    as_json = subprocess.run(kvgate_command("shadow", "report", "--policies", str(policy.root), "--format", "json"),
                             capture_output=True, text=True, env=cli_env, check=True, timeout=60)
    assert json.loads(as_json.stdout)["tenants"]["ab"]["pairs"] == 4


def test_report_with_its_store_down_is_a_503(sim: ServerProcess, redis_server: RedisProcess, tmp_path: Path) -> None:
    policy = ab_policy(tmp_path / "policies", sim)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_REDIS_URL": redis_server.url}
    with run_gateway(policy.root, tmp_path / "gw.log", new_secret(), env) as gateway:
        send(gateway, policy.keys["ab"], "before the store went away")
        wait_pairs(gateway, policy.keys["root"], 1)
        redis_server.kill()
        answer = httpx.get(f"{gateway.url}/admin/shadow", headers=bearer(policy.keys["root"]), timeout=30)
    assert answer.status_code == 503
    error = answer.json()["error"]
    assert error["type"] == "service_unavailable"
    assert "shadow store" in error["message"]
