"""Hot reload: edits take effect, SIGHUP reloads, a broken directory never replaces the good set;
and a dead upstream gives a clear error while the gateway stays healthy."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.procs import ServerProcess, free_port, kvgate_command

RELOAD_DEADLINE_S = 20.0


@pytest.fixture
def reloadable(sim: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServerProcess, PolicyDir, str]]:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    secret = new_secret()
    with run_gateway(policy.root, tmp_path / "gateway.log", secret, {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield gateway, policy, secret


def policy_version(gateway: ServerProcess, policy: PolicyDir) -> str:
    reply = httpx.get(f"{gateway.url}/admin/policies", headers=bearer(policy.keys["root"]), timeout=10)
    version: str = reply.json()["policy_version"]
    return version


def wait_for_version_change(gateway: ServerProcess, policy: PolicyDir, old: str) -> str:
    deadline = time.monotonic() + RELOAD_DEADLINE_S
    while (version := policy_version(gateway, policy)) == old and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the gateway until the reload shows
    return version


def wait_for_log(gateway: ServerProcess, text: str, count: int = 1) -> None:
    deadline = time.monotonic() + RELOAD_DEADLINE_S
    while gateway.log_text().count(text) < count and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the log until the watcher reports
    assert gateway.log_text().count(text) >= count


def salt_seen(gateway: ServerProcess, sim: ServerProcess, key: str) -> object:
    body = {"model": SIM_MODEL, "prompt": "epoch", "max_tokens": 1}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=10)
    assert reply.status_code == 200
    records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
    return next(r for r in records if r["request_id"] == reply.headers["x-request-id"])["cache_salt"]


def test_edit_takes_effect_without_restart(reloadable: tuple[ServerProcess, PolicyDir, str],
                                           sim: ServerProcess) -> None:
    gateway, policy, secret = reloadable
    old = policy_version(gateway, policy)
    policy.tenants["acme"]["cache"] = {"salt_epoch": 7}
    policy.write_tenant("acme", policy.tenants["acme"])
    assert wait_for_version_change(gateway, policy, old) != old
    assert salt_seen(gateway, sim, policy.keys["acme"]) == expected_salt(secret, "acme", 7)


def test_new_key_works_after_reload(reloadable: tuple[ServerProcess, PolicyDir, str]) -> None:
    gateway, policy, _ = reloadable
    old = policy_version(gateway, policy)
    new_key = policy.add_key("acme", ("inference",))
    assert httpx.get(f"{gateway.url}/v1/models", headers=bearer(new_key)).status_code == 401
    policy.write_tenant("acme", policy.tenants["acme"])
    wait_for_version_change(gateway, policy, old)
    assert httpx.get(f"{gateway.url}/v1/models", headers=bearer(new_key)).status_code == 200


def test_broken_file_keeps_the_last_good_policy(reloadable: tuple[ServerProcess, PolicyDir, str]) -> None:
    gateway, policy, _ = reloadable
    good = policy_version(gateway, policy)
    (policy.root / "tenants" / "acme.yaml").write_text("tenant: acme\nkeys: [ {sha256: nope\n")
    wait_for_log(gateway, "policy_reload_rejected")
    assert policy_version(gateway, policy) == good
    assert httpx.get(f"{gateway.url}/v1/models", headers=bearer(policy.keys["acme"])).status_code == 200
    metrics = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["ops"])).text
    assert 'kvgate_policy_reloads_total{result="error"} 1.0' in metrics


def test_invalid_but_parseable_policy_is_rejected_too(reloadable: tuple[ServerProcess, PolicyDir, str]) -> None:
    gateway, policy, _ = reloadable
    good = policy_version(gateway, policy)
    policy.tenants["beta"]["rollout"] = {"pool": "does-not-exist"}
    policy.write_tenant("beta", policy.tenants["beta"])
    wait_for_log(gateway, "policy_reload_rejected")
    assert policy_version(gateway, policy) == good
    assert "rollout.pool" in gateway.log_text()


def test_sighup_reloads(sim: ServerProcess, tmp_path: Path) -> None:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    slow_polling = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_RELOAD_INTERVAL_S": "3600"}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), slow_polling) as gateway:
        old = policy_version(gateway, policy)
        policy.tenants["acme"]["measure_ttft"] = True
        policy.write_tenant("acme", policy.tenants["acme"])
        gateway.send_signal(signal.SIGHUP)
        assert wait_for_version_change(gateway, policy, old) != old
        assert gateway.popen.poll() is None


def test_upstream_down_is_502_and_gateway_stays_healthy(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    policy = PolicyDir(tmp_path / "policies", {"offload": {"upstreams": [dead]}}, public_paths=["/livez"])
    key = policy.add_tenant("acme")
    policy.write()
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret()) as gateway:
        body = {"model": SIM_MODEL, "prompt": "x"}
        for stream in (False, True):
            reply = httpx.post(f"{gateway.url}/v1/completions", json={**body, "stream": stream},
                               headers=bearer(key), timeout=10)
            assert reply.status_code == 502
            assert reply.json()["error"]["type"] == "upstream_error"
        assert httpx.get(f"{gateway.url}/livez").status_code == 200


def test_a_pool_key_missing_from_the_environment_refuses_start(sim: ServerProcess, tmp_path: Path) -> None:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {"KVGATE_SALT_SECRET": new_secret(), "KVGATE_STATE_PATH": str(tmp_path / "s.sqlite3"), "PATH": "/usr/bin"}
    started = subprocess.run([*kvgate_command("serve", "--policies", str(policy.root), "--port", str(free_port()))],
                             env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1
    assert f"pools.offload.api_key_env: ${UPSTREAM_KEY_ENV} is not set or empty" in started.stderr


def test_a_reload_adding_a_pool_whose_key_is_missing_is_rejected(
    reloadable: tuple[ServerProcess, PolicyDir, str],
) -> None:
    gateway, policy, _ = reloadable
    good = policy_version(gateway, policy)
    policy.gateway["pools"]["spare"] = {"upstreams": ["http://127.0.0.1:9"], "api_key_env": "SPARE_POOL_KEY_UNSET"}
    policy.write()
    wait_for_log(gateway, "policy_reload_rejected")
    assert policy_version(gateway, policy) == good
    assert "pools.spare.api_key_env: $SPARE_POOL_KEY_UNSET is not set or empty" in gateway.log_text()
