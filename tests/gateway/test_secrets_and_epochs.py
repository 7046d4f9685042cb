"""Secrets and policy semantics that protect tenants, against real gateway processes:

- `serve` refuses a missing, empty or short salt secret; `api_key_env` may not name a KVGATE_* variable;
- a policy set that lowers a tenant's salt epoch below the highest ever in force is refused — on reload, at
  start-up after a restart, by `kvgate policy check` and by another replica — with the floor in SQLite or in
  a real redis-server;
- a request whose body arrives after a reload goes upstream under the set then in force: a `tenant forget` made
  meanwhile gives it the new salt, a key revoked meanwhile refuses it;
- `tenant forget` refuses a tenant without a salt; `policy check` warns about rules such a tenant cannot have
  audited, and the audit marks it "not auditable (no salt)".
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, Stack
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.ledger.redis_proc import RedisProcess
from tests.procs import ServerProcess, free_port, kvgate_command
from tests.sim.helpers import poll

STARTUP_FAILED = 3
CLI_TIMEOUT_S = 120


def kvgate(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {name: value for name, value in os.environ.items() if not name.startswith("KVGATE_")}
    return subprocess.run(kvgate_command(*args), capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
                          env={**clean, **(env or {})}, check=False)


def policy_dir(root: Path, sim_url: str, acme_epoch: int = 1) -> PolicyDir:
    pools = {"offload": {"upstreams": [sim_url], "api_key_env": UPSTREAM_KEY_ENV}}
    policy = PolicyDir(root, pools)
    policy.add_tenant("acme", cache={"salt_epoch": acme_epoch})
    policy.add_tenant("nonet", cache={"isolation": "none"},
                      offload={"retention_seconds": 60, "allowed_media": ["GPU"]})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    return policy


# -- the salt secret and upstream key variables ----------------------------------------------------------


@pytest.mark.parametrize("secret", [None, "", "x" * 31])
def test_serve_refuses_a_missing_empty_or_short_secret(sim: ServerProcess, tmp_path: Path,
                                                       secret: str | None) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    env = {"KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3")}
    if secret is not None:
        env["KVGATE_SALT_SECRET"] = secret
    result = kvgate("serve", "--policies", str(policy.root), "--port", str(free_port()), env=env)
    assert result.returncode == 2, result.stderr
    assert "KVGATE_SALT_SECRET" in result.stderr and "openssl rand -hex 32" in result.stderr
    assert "x" * 31 not in result.stderr + result.stdout  # the secret itself is never echoed


def test_a_32_byte_secret_is_enough(sim: ServerProcess, tmp_path: Path) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    with run_gateway(policy.root, tmp_path / "gateway.log", "s" * 32, {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        assert httpx.get(f"{gateway.url}/livez", timeout=10).status_code == 401


@pytest.mark.parametrize("variable", ["KVGATE_SALT_SECRET", "kvgate_redis_url", "NOT A NAME"])
def test_api_key_env_may_not_name_gateway_settings(tmp_path: Path, variable: str) -> None:
    policy = PolicyDir(tmp_path / "policies", {"offload": {"upstreams": ["http://127.0.0.1:9"],
                                                           "api_key_env": variable}})
    policy.add_tenant("acme")
    policy.write()
    result = kvgate("policy", "check", str(policy.root))
    assert result.returncode == 1
    assert "pools.offload.api_key_env" in result.stderr


# -- the salt-epoch floor ----------------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "redis"])
def store_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3")}
        return
    server = RedisProcess(tmp_path / "redis").start()  # its own server: the floor key is per deployment
    try:
        yield {"KVGATE_REDIS_URL": server.url, "KVGATE_STATE_PATH": str(tmp_path / "unused.sqlite3")}
    finally:
        server.stop()


def acme_salt_seen(stack: Stack) -> object:
    body = {"model": SIM_MODEL, "prompt": "epoch", "max_tokens": 2}
    reply = httpx.post(f"{stack.url}/v1/completions", json=body, headers=bearer(stack.key("acme")), timeout=30)
    assert reply.status_code == 200, reply.text
    return stack.sim_request(reply.headers["x-request-id"])["cache_salt"]


def reload_errors(stack: Stack) -> float:
    text = httpx.get(f"{stack.url}/metrics", headers=bearer(stack.key("root")), timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith('kvgate_policy_reloads_total{result="error"}')]
    return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0  # the series appears with the first error


def test_a_lowered_epoch_is_refused_on_reload_restart_check_and_replica(
    sim: ServerProcess, tmp_path: Path, store_env: dict[str, str]
) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    secret = new_secret()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, **store_env}
    with run_gateway(policy.root, tmp_path / "gateway.log", secret, env) as gateway:
        stack = Stack(gateway=gateway, sim=sim, policy=policy, secret=secret)
        assert acme_salt_seen(stack) == expected_salt(secret, "acme", 1)
        forget = kvgate("tenant", "forget", "acme", "--policies", str(policy.root))
        assert forget.returncode == 0, forget.stderr
        poll(lambda: acme_salt_seen(stack) == expected_salt(secret, "acme", 2), what="epoch 2 in force")

        errors = reload_errors(stack)
        policy.tenants["acme"]["cache"] = {"salt_epoch": 1}  # the roll-back of a GitOps repository
        policy.write_tenant("acme", policy.tenants["acme"])
        poll(lambda: reload_errors(stack) > errors, what="the roll-back refused")
        assert acme_salt_seen(stack) == expected_salt(secret, "acme", 2)
        reply = httpx.post(f"{stack.url}/admin/reload", headers=bearer(stack.key("root")), timeout=10)
        assert reply.json()["reloaded"] is False
    assert "is below 2, the highest epoch ever in force for 'acme'" in gateway.log_path.read_text()

    # After a restart, and for another replica on the same store: the set cannot come into force at all.
    started = kvgate("serve", "--policies", str(policy.root), "--port", str(free_port()),
                     env={"KVGATE_SALT_SECRET": secret, **env})
    assert started.returncode == STARTUP_FAILED, started.stdout + started.stderr
    assert "is below 2" in started.stdout + started.stderr

    check = kvgate("policy", "check", str(policy.root), env=store_env)
    assert check.returncode == 1
    assert "tenants/acme.yaml: cache.salt_epoch: 1 is below 2" in check.stderr
    policy.tenants["acme"]["cache"] = {"salt_epoch": 2}
    policy.write_tenant("acme", policy.tenants["acme"])
    assert kvgate("policy", "check", str(policy.root), env=store_env).returncode == 0


def test_a_removed_tenant_cannot_come_back_below_its_floor(sim: ServerProcess, tmp_path: Path) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url, acme_epoch=5)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3")}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env):
        pass
    del policy.tenants["acme"]
    (policy.root / "tenants" / "acme.yaml").unlink()
    with run_gateway(policy.root, tmp_path / "gateway2.log", new_secret(), env):
        pass
    policy.add_tenant("acme", cache={"salt_epoch": 1})
    policy.write()
    check = kvgate("policy", "check", str(policy.root), env={"KVGATE_STATE_PATH": env["KVGATE_STATE_PATH"]})
    assert check.returncode == 1 and "1 is below 5" in check.stderr


# -- a slow body outlasting a reload ---------------------------------------------------------------------------


class HalfSentRequest:
    """A completion request whose body is sent in two parts over a raw connection, the second part later."""

    def __init__(self, url: str, key: str) -> None:
        body = json.dumps({"model": SIM_MODEL, "prompt": "straggler", "max_tokens": 2}).encode()
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
        self.sock.sendall(head.encode() + body[:10])
        self.rest = body[10:]

    def finish(self) -> tuple[int, dict[str, str]]:
        self.sock.sendall(self.rest)
        reply = b""
        while chunk := self.sock.recv(65536):
            reply += chunk
        self.sock.close()
        head = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in head[1:])
        return int(head[0].split()[1]), headers


def admitted_and_waiting(stack: Stack) -> bool:
    """True once the half-sent request holds acme's only slot (it was admitted and waits for its body)."""
    body = {"model": SIM_MODEL, "prompt": "probe", "max_tokens": 2}
    reply = httpx.post(f"{stack.url}/v1/completions", json=body, headers=bearer(stack.key("acme")), timeout=30)
    return reply.status_code == 429


def reload_now(stack: Stack) -> str:
    """The version of the set in force after a reload (the periodic check may have installed it already)."""
    reply = httpx.post(f"{stack.url}/admin/reload", headers=bearer(stack.key("root")), timeout=10)
    version: str = reply.json()["policy_version"]
    return version


@pytest.fixture
def one_slot_stack(sim: ServerProcess, tmp_path: Path) -> Iterator[Stack]:
    policy = policy_dir(tmp_path / "policies", sim.url)
    policy.tenants["acme"]["limits"] = {"max_in_flight": 1}
    policy.write()
    secret = new_secret()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3")}
    with run_gateway(policy.root, tmp_path / "gateway.log", secret, env) as gateway:
        yield Stack(gateway=gateway, sim=sim, policy=policy, secret=secret)


def test_a_body_that_arrives_after_tenant_forget_goes_upstream_with_the_new_salt(one_slot_stack: Stack) -> None:
    stack = one_slot_stack
    straggler = HalfSentRequest(stack.url, stack.key("acme"))
    poll(lambda: admitted_and_waiting(stack), what="the half-sent request admitted under epoch 1")
    admitted_under = reload_now(stack)
    forget = kvgate("tenant", "forget", "acme", "--policies", str(stack.policy.root))
    assert forget.returncode == 0, forget.stderr
    assert reload_now(stack) != admitted_under
    status, headers = straggler.finish()
    assert status == 200
    assert stack.sim_request(headers["x-request-id"])["cache_salt"] == expected_salt(stack.secret, "acme", 2)


def test_a_body_that_arrives_after_its_key_was_revoked_is_refused(one_slot_stack: Stack) -> None:
    stack = one_slot_stack
    straggler = HalfSentRequest(stack.url, stack.key("acme"))
    poll(lambda: admitted_and_waiting(stack), what="the half-sent request admitted")
    admitted_under = reload_now(stack)
    stack.policy.tenants["acme"]["keys"] = []
    stack.policy.add_key("acme", ("inference",))
    stack.policy.write_tenant("acme", stack.policy.tenants["acme"])
    assert reload_now(stack) != admitted_under
    status, headers = straggler.finish()
    assert status == 401
    assert not [entry for entry in stack.sim_requests() if entry.get("request_id") == headers["x-request-id"]]


# -- tenants without a salt ---------------------------------------------------------------------------------


def test_forget_refuses_a_tenant_without_a_salt(sim: ServerProcess, tmp_path: Path) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    before = (policy.root / "tenants" / "nonet.yaml").read_text()
    result = kvgate("tenant", "forget", "nonet", "--policies", str(policy.root))
    assert result.returncode == 1
    assert "isolation: none" in result.stderr and "no cache_salt" in result.stderr
    assert (policy.root / "tenants" / "nonet.yaml").read_text() == before


def test_policy_check_warns_about_rules_that_cannot_be_audited(sim: ServerProcess, tmp_path: Path) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    result = kvgate("policy", "check", str(policy.root), env={"KVGATE_STATE_PATH": str(tmp_path / "none.sqlite3")})
    assert result.returncode == 0, result.stderr
    assert "warning: tenants/nonet.yaml: offload.retention_seconds: cannot be audited" in result.stderr
    assert "warning: tenants/nonet.yaml: offload.allowed_media: cannot be audited" in result.stderr
    assert "acme" not in result.stderr


def test_audit_marks_a_tenant_without_a_salt_not_auditable(sim: ServerProcess, tmp_path: Path) -> None:
    policy = policy_dir(tmp_path / "policies", sim.url)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3")}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env) as gateway:
        audit = httpx.get(f"{gateway.url}/admin/audit", headers=bearer(policy.keys["root"]), timeout=10).json()
    assert audit["tenants"]["nonet"] == {"not_auditable": "not auditable (no salt)"}
    assert audit["tenants"]["acme"]["GPU"]["stored"] == 0
    table = kvgate("audit", "--policies", str(policy.root), env={"KVGATE_STATE_PATH": env["KVGATE_STATE_PATH"]})
    assert table.returncode == 0, table.stderr
    assert any(line.split()[:4] == ["nonet", "not", "auditable", "(no"] for line in table.stdout.splitlines())
