"""README promises that had no test, or a test the simplest wrong implementation would pass.

Each test names the wrong version it catches. Expected salts are literal known-answer vectors
(tests/salt_vectors.py), never the product's own derivation.
"""

from __future__ import annotations

import json
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, Stack, standard_policy
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.procs import ServerProcess

DEADLINE_S = 30.0
SECRET = new_secret()
# What the gateway itself puts on every upstream request (framing, its id, the pool key), and the client
# headers the README lets through. Anything else a client sends must not reach the upstream.
GATEWAY_SET = {"host", "content-length", "content-type", "x-request-id", "accept-encoding"}
ALLOWED_FROM_CLIENT = {"accept", "user-agent", "traceparent", "tracestate", "baggage"}


def _post(stack: Stack, tenant: str, path: str, body: object, **headers: str) -> httpx.Response:
    with stack.client(tenant) as client:
        return client.post(path, json=body, headers=headers)


def _records_after(sim_url: str, seq: int) -> list[dict[str, object]]:
    records: list[dict[str, object]] = httpx.get(f"{sim_url}/sim/requests", timeout=10).json()["requests"]
    return [record for record in records if isinstance(record["seq"], int) and record["seq"] > seq]


def _last_seq(sim_url: str) -> int:
    records = httpx.get(f"{sim_url}/sim/requests", timeout=10).json()["requests"]
    return max((int(record["seq"]) for record in records), default=-1)


def _poll(probe: object, what: str) -> None:
    """Poll `probe()` until it is true, failing with `what` at the deadline."""
    assert callable(probe)
    deadline = time.monotonic() + DEADLINE_S
    while not probe():
        assert time.monotonic() < deadline, f"not seen within {DEADLINE_S}s: {what}"
        time.sleep(0.05)  # polling an observable record, not synchronisation


# -- cache_salt on every generation API -----------------------------------------------------------------


def test_responses_api_requests_get_the_tenant_salt(stack: Stack) -> None:
    """Wrong version: the rewrite skips /v1/responses, so tenants share cache through that API."""
    reply = _post(stack, "acme", "/v1/responses", {"model": SIM_MODEL, "input": "respond", "max_output_tokens": 3})
    assert reply.status_code == 200
    seen = stack.sim_request(reply.headers["x-request-id"])
    assert seen["cache_salt"] == "a177b1287e445c7b774eff569fea8abdfb3497e60c0629368b399ac6f094addb"
    assert seen["cache_salt"] == expected_salt(stack.secret, "acme")


def test_responses_api_replaces_a_client_salt_for_replace_tenants(stack: Stack) -> None:
    body = {"model": SIM_MODEL, "input": "respond", "max_output_tokens": 3, "cache_salt": "someone-else"}
    reply = _post(stack, "beta", "/v1/responses", body)
    assert reply.status_code == 200
    assert stack.sim_request(reply.headers["x-request-id"])["cache_salt"] == expected_salt(stack.secret, "beta")


def test_embeddings_get_the_per_user_salt(stack: Stack) -> None:
    reply = _post(stack, "gamma", "/v1/embeddings", {"model": SIM_MODEL, "input": "vector", "user": "bob"})
    assert reply.status_code == 200
    assert stack.sim_request(reply.headers["x-request-id"])["cache_salt"] == expected_salt(
        stack.secret, "gamma", 1, "bob")


# -- headers: an allow-list, not a deny-list ------------------------------------------------------------


def test_only_allow_listed_client_headers_reach_the_upstream(stack: Stack) -> None:
    """Wrong version: drop only the key and the three steering headers, forward everything else."""
    allowed = {"accept": "application/json", "user-agent": "promise-test/1",
               "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
               "tracestate": "vendor=value", "baggage": "team=kv"}
    others = {"cookie": "session=secret", "x-forwarded-for": "10.0.0.1", "forwarded": "for=10.0.0.1",
              "x-real-ip": "10.0.0.2", "x-custom-thing": "1", "origin": "https://evil.example",
              "referer": "https://evil.example/page", "x-vllm-priority": "-1", "x-session-id": "s",
              "x-data-parallel-rank": "1", "x-kvgate-pool": "control", "prefer": "respond-async"}
    reply = _post(stack, "acme", "/v1/completions", {"model": SIM_MODEL, "prompt": "h", "max_tokens": 1},
                  **allowed, **others)
    assert reply.status_code == 200
    seen = stack.sim_request(reply.headers["x-request-id"])
    headers, credentials = seen["headers"], seen["credential_sha256"]
    assert isinstance(headers, dict) and isinstance(credentials, dict)
    assert set(headers) == GATEWAY_SET | ALLOWED_FROM_CLIENT
    assert {name: headers[name] for name in ALLOWED_FROM_CLIENT} == allowed
    assert set(credentials) == {"authorization"}  # the pool key only: no cookie, no client key


# -- authentication before the body is read --------------------------------------------------------------


def _raw_exchange(url: str, head: bytes) -> bytes:
    """Send only a request head (the announced body never comes) and read the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as conn:
        conn.sendall(head)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = conn.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


@pytest.mark.parametrize("length", [1000, 11 * 1024 * 1024])
@pytest.mark.parametrize("credential", ["", "Authorization: Bearer kvg_not-a-real-key\r\n"])
def test_a_request_without_a_valid_key_is_refused_before_its_body_arrives(
    stack: Stack, length: int, credential: str
) -> None:
    """Wrong version: read the body, then authenticate. With a body that is never sent it would wait forever
    (small body: no answer before the socket deadline) or answer 413 (oversized body)."""
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"{credential}Content-Length: {length}\r\n\r\n").encode()
    answer = _raw_exchange(stack.url, head)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:80]


def test_a_key_without_the_scope_is_refused_before_the_body_arrives(stack: Stack) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {stack.key('ops')}\r\nContent-Length: 1000\r\n\r\n").encode()
    assert _raw_exchange(stack.url, head).startswith(b"HTTP/1.1 403 ")


# -- client disconnect on non-streaming requests --------------------------------------------------------


@pytest.mark.parametrize("tenant", ["acme", "delta"])  # delta: measure_ttft (streams upstream, answers whole)
def test_client_disconnect_cancels_a_non_streaming_request(stack: Stack, tenant: str) -> None:
    """Wrong version: only streams watch for the client going away; the upstream keeps running."""
    before = _last_seq(stack.sim.url)
    body = json.dumps({"model": SIM_MODEL, "prompt": f"[[sim:hang]] {uuid.uuid4().hex}", "max_tokens": 4}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {stack.key(tenant)}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    host, port = stack.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as conn:
        conn.sendall(head + body)
        _poll(lambda: any(r["outcome"] == "in_progress" for r in _records_after(stack.sim.url, before)),
              "the request reaching the simulator")
    _poll(lambda: [r["outcome"] for r in _records_after(stack.sim.url, before)] == ["aborted"],
          "the simulator seeing the upstream request cancelled")


# -- upstream errors and timeouts -------------------------------------------------------------------------


def test_upstream_errors_keep_their_status_and_body(stack: Stack) -> None:
    """Wrong version: re-wrap upstream errors in the gateway's own error body."""
    body = {"model": SIM_MODEL, "prompt": "fail [[sim:status=503]]", "max_tokens": 2}
    through = _post(stack, "acme", "/v1/completions", body)
    direct = httpx.post(f"{stack.sim.url}/v1/completions", json=body, timeout=30,
                        headers={"Authorization": f"Bearer {UPSTREAM_KEY}"})
    assert through.status_code == direct.status_code == 503
    assert through.json() == direct.json()


@pytest.fixture
def slow_reading_gateway(sim: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_READ_TIMEOUT_S": "1"}
    with run_gateway(policy.root, tmp_path / "gateway.log", SECRET, env) as gateway:
        yield gateway, policy


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_timeout_is_504(slow_reading_gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess,
                                 stream: bool) -> None:
    """The upstream never answers; KVGATE_READ_TIMEOUT_S bounds the wait and the client gets a 504."""
    gateway, policy = slow_reading_gateway
    before = _last_seq(sim.url)
    body = {"model": SIM_MODEL, "prompt": "[[sim:hang]] timeout", "max_tokens": 2, "stream": stream}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(policy.keys["acme"]),
                       timeout=DEADLINE_S)
    assert reply.status_code == 504
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    _poll(lambda: [r["outcome"] for r in _records_after(sim.url, before)] == ["aborted"],
          "the timed-out upstream request closed")


# -- POST /admin/reload -------------------------------------------------------------------------------------


@pytest.fixture
def manual_reload_gateway(sim: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_RELOAD_INTERVAL_S": "3600"}  # the watcher will not act
    with run_gateway(policy.root, tmp_path / "gateway.log", SECRET, env) as gateway:
        yield gateway, policy


def _salt_for(gateway: ServerProcess, sim: ServerProcess, key: str) -> object:
    reply = httpx.post(f"{gateway.url}/v1/completions", json={"model": SIM_MODEL, "prompt": "e", "max_tokens": 1},
                       headers=bearer(key), timeout=DEADLINE_S)
    assert reply.status_code == 200
    records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
    return next(r for r in records if r["request_id"] == reply.headers["x-request-id"])["cache_salt"]


def _admin_reload(gateway: ServerProcess, policy: PolicyDir) -> dict[str, object]:
    reply = httpx.post(f"{gateway.url}/admin/reload", headers=bearer(policy.keys["root"]), timeout=DEADLINE_S)
    assert reply.status_code == 200
    result: dict[str, object] = reply.json()
    return result


def _reload_errors(gateway: ServerProcess, policy: PolicyDir) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["ops"]), timeout=10).text
    series = 'kvgate_policy_reloads_total{result="error"} '
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(series)]
    return values[0] if values else 0.0  # the series appears with the first rejected reload


def test_admin_reload_applies_a_changed_directory_at_once(
    manual_reload_gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    gateway, policy = manual_reload_gateway
    acme = policy.keys["acme"]
    assert _salt_for(gateway, sim, acme) == expected_salt(SECRET, "acme", 1)
    policy.tenants["acme"]["cache"] = {"salt_epoch": 7}
    policy.write_tenant("acme", policy.tenants["acme"])
    assert _salt_for(gateway, sim, acme) == expected_salt(SECRET, "acme", 1)  # not yet
    result = _admin_reload(gateway, policy)
    assert result["reloaded"] is True
    assert _salt_for(gateway, sim, acme) == "3afa14c953ca1a704f05ac2dad894c65bbd5a4c742c100931f8d001a54648496"
    assert _admin_reload(gateway, policy) == {"reloaded": False, "policy_version": result["policy_version"]}


def test_admin_reload_of_a_broken_directory_keeps_the_last_good_set(
    manual_reload_gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    gateway, policy = manual_reload_gateway
    version = _admin_reload(gateway, policy)["policy_version"]
    errors = _reload_errors(gateway, policy)
    (policy.root / "tenants" / "broken.yaml").write_text("tenant: broken\nkeys: not-a-list\n")
    assert _admin_reload(gateway, policy) == {"reloaded": False, "policy_version": version}
    assert _reload_errors(gateway, policy) == errors + 1
    assert _salt_for(gateway, sim, policy.keys["acme"]) == expected_salt(SECRET, "acme", 1)



def test_sighup_with_a_broken_directory_keeps_the_last_good_set(
    manual_reload_gateway: tuple[ServerProcess, PolicyDir], sim: ServerProcess
) -> None:
    gateway, policy = manual_reload_gateway
    errors = _reload_errors(gateway, policy)
    (policy.root / "tenants" / "broken.yaml").write_text("tenant: broken\nkeys: not-a-list\n")
    gateway.send_signal(signal.SIGHUP)
    _poll(lambda: _reload_errors(gateway, policy) == errors + 1, "the rejected reload counted")
    assert _salt_for(gateway, sim, policy.keys["acme"]) == expected_salt(SECRET, "acme", 1)
