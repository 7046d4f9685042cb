"""Tenant limits (`limits.max_in_flight`, `limits.requests_per_minute`), the global in-flight cap, and
per-minute limits shared by two replicas through a real redis-server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.ledger.redis_proc import RedisProcess
from tests.procs import ServerProcess

DEADLINE_S = 20.0


def limited_policy(root: Path, sim: ServerProcess) -> PolicyDir:
    pools = {"offload": {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV}}
    policy = PolicyDir(root, pools, public_paths=["/livez"])
    policy.add_tenant("narrow", limits={"max_in_flight": 2})
    policy.add_tenant("metered", limits={"requests_per_minute": 4})
    policy.add_tenant("free")
    policy.add_tenant("ops", scopes=("metrics",))
    policy.write()
    return policy


def completion(url: str, key: str, prompt: str = "hello") -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 2}
    return httpx.post(f"{url}/v1/completions", json=body, headers=bearer(key), timeout=30)


def hanging_request(gateway: ServerProcess, key: str) -> socket.socket:
    """A request the simulator never answers; it stays in flight until the socket closes."""
    body = json.dumps({"model": SIM_MODEL, "prompt": "[[sim:hang]]", "max_tokens": 2}).encode()
    sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=DEADLINE_S)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key.encode()
                 + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
                 + b"\r\n\r\n" + body)
    return sock


def first_with_status(gateway: ServerProcess, key: str, path: str, status: int) -> httpx.Response:
    """Poll with fresh requests until one gets `status` (the held requests are admitted asynchronously)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        reply = httpx.get(f"{gateway.url}{path}", headers=bearer(key), timeout=30) if path == "/v1/models" \
            else completion(gateway.url, key)
        if reply.status_code == status or time.monotonic() > deadline:
            return reply
        assert reply.status_code == 200, reply.text


def rate_limited(gateway: ServerProcess, ops_key: str, tenant: str, limit: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(ops_key), timeout=10).text
    prefix = f'kvgate_rate_limited_total{{limit="{limit}",tenant="{tenant}"}}'
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def assert_openai_refusal(reply: httpx.Response, status: int, code: str) -> None:
    assert reply.status_code == status, reply.text
    assert int(reply.headers["retry-after"]) >= 1
    error = reply.json()["error"]
    assert error["code"] == code
    assert set(error) == {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def limited(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    root = tmp_path_factory.mktemp("limited")
    policy = limited_policy(root / "policies", sim)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    with run_gateway(policy.root, root / "gateway.log", new_secret(), env) as gateway:
        yield gateway, policy


def test_max_in_flight_is_429_and_frees_up(limited: tuple[ServerProcess, PolicyDir]) -> None:
    gateway, policy = limited
    key = policy.keys["narrow"]
    with ExitStack() as held:
        for _ in range(2):
            held.enter_context(hanging_request(gateway, key))
        refused = first_with_status(gateway, key, "/v1/completions", 429)
        assert_openai_refusal(refused, 429, "rate_limit_exceeded")
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert completion(gateway.url, policy.keys["free"]).status_code == 200  # other tenants are not held up
        assert rate_limited(gateway, policy.keys["ops"], "narrow", "max_in_flight") >= 1
    assert first_with_status(gateway, key, "/v1/completions", 200).status_code == 200


def test_requests_per_minute_is_429_with_retry_after(limited: tuple[ServerProcess, PolicyDir]) -> None:
    gateway, policy = limited
    key = policy.keys["metered"]
    assert [completion(gateway.url, key).status_code for _ in range(4)] == [200] * 4
    refused = completion(gateway.url, key)
    assert_openai_refusal(refused, 429, "rate_limit_exceeded")
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert rate_limited(gateway, policy.keys["ops"], "metered", "requests_per_minute") == 1
    assert completion(gateway.url, policy.keys["free"]).status_code == 200


def test_global_in_flight_cap_is_503_but_probes_answer(sim: ServerProcess, tmp_path: Path) -> None:
    policy = limited_policy(tmp_path / "policies", sim)
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_MAX_IN_FLIGHT": "2"}
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env) as gateway, ExitStack() as held:
        for _ in range(2):
            held.enter_context(hanging_request(gateway, policy.keys["free"]))
        refused = first_with_status(gateway, policy.keys["free"], "/v1/models", 503)
        assert_openai_refusal(refused, 503, "overloaded")
        assert httpx.get(f"{gateway.url}/livez", timeout=10).status_code == 200
        assert rate_limited(gateway, policy.keys["ops"], "_all", "global_in_flight") >= 1


@pytest.mark.redis
def test_per_minute_limit_is_shared_by_two_replicas_through_redis(sim: ServerProcess, tmp_path: Path) -> None:
    redis_server = RedisProcess(tmp_path / "redis").start()
    try:
        policy = limited_policy(tmp_path / "policies", sim)
        env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_REDIS_URL": redis_server.url}
        secret = new_secret()
        with ExitStack() as stack:
            replicas = [stack.enter_context(run_gateway(policy.root, tmp_path / f"gw{n}.log", secret, env))
                        for n in range(2)]
            key = policy.keys["metered"]
            statuses = [completion(replicas[index % 2].url, key).status_code for index in range(4)]
            assert statuses == [200] * 4
            # Each replica has seen only two requests; only a shared budget refuses the fifth.
            assert_openai_refusal(completion(replicas[1].url, key), 429, "rate_limit_exceeded")
            assert_openai_refusal(completion(replicas[0].url, key), 429, "rate_limit_exceeded")
    finally:
        redis_server.stop()
