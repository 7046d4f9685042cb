"""Shadow A/B through real processes: pairs are compared, a corrupted arm is caught, and the primary
is unaffected whatever the shadow pool does."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir, bearer, expected_salt, new_secret, run_gateway
from tests.procs import ServerProcess, free_port, run_server, upstream_module

DEADLINE_S = 30.0
SHADOW_REPLY_BOUND = 64 * 1024 * 1024  # what the gateway keeps of one arm's reply for a comparison
CONTROL_KEY = "control-pool-key"  # the control pool's upstream has a key of its own
CONTROL_KEY_ENV = "UPSTREAM_TEST_CONTROL_KEY"


@pytest.fixture(scope="module")
def control_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sim_process(tmp_path_factory.mktemp("control"), api_key=CONTROL_KEY) as server:
        yield server


@pytest.fixture(scope="module")
def corrupt_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sim_process(tmp_path_factory.mktemp("corrupt"), "--corrupt-output", api_key=CONTROL_KEY) as server:
        yield server


def shadow_gateway(tmp: Path, primary: str, shadow: str, max_in_flight: int = 4,
                   env: dict[str, str] | None = None) -> tuple[PolicyDir, str, Any]:
    pools = {"offload": {"upstreams": [primary], "api_key_env": UPSTREAM_KEY_ENV},
             "control": {"upstreams": [shadow], "api_key_env": CONTROL_KEY_ENV}}
    policy = PolicyDir(tmp / "policies", pools, public_paths=["/livez"])
    policy.add_tenant("ab", rollout={"pool": "offload"}, offload={"max_offload_tokens": 256},
                      shadow={"pool": "control", "sample": 1.0, "max_in_flight": max_in_flight})
    policy.add_tenant("plain", rollout={"pool": "offload"})
    policy.add_tenant("root", scopes=("admin", "metrics"))
    policy.write()
    secret = new_secret()
    gateway_env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, CONTROL_KEY_ENV: CONTROL_KEY, **(env or {})}
    gateway = run_gateway(policy.root, tmp / "gateway.log", secret, gateway_env)
    return policy, secret, gateway


def stream_text(gateway: ServerProcess, key: str, prompt: str) -> tuple[str, str]:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=30) as reply:
        assert reply.status_code == 200
        raw = b"".join(reply.iter_bytes()).decode()
        return raw, reply.headers["x-request-id"]


def generated(raw: str) -> str:
    import json

    texts = [json.loads(line[6:])["choices"][0]["text"] for line in raw.splitlines()
             if line.startswith("data: {") and '"text"' in line]
    return "".join(texts)


def shadow_counts(gateway: ServerProcess, policy: PolicyDir) -> dict[str, float]:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["root"]), timeout=10).text
    counts = {}
    for line in text.splitlines():
        if line.startswith('kvgate_shadow_requests_total{') and 'tenant="ab"' in line:
            outcome = line.split('outcome="')[1].split('"')[0]
            counts[outcome] = float(line.rsplit(" ", 1)[1])
    return {outcome: value for outcome, value in counts.items() if value}  # counters start at 0


def wait_counts(gateway: ServerProcess, policy: PolicyDir, total: int) -> dict[str, float]:
    deadline = time.monotonic() + DEADLINE_S
    while sum((counts := shadow_counts(gateway, policy)).values()) < total and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the gateway's counters until every shadow has settled
    return counts


def admin_shadow(gateway: ServerProcess, policy: PolicyDir) -> dict[str, Any]:
    reply = httpx.get(f"{gateway.url}/admin/shadow", headers=bearer(policy.keys["root"]), timeout=30)
    assert reply.status_code == 200
    report: dict[str, Any] = reply.json()["tenants"]["ab"]
    return report


def test_pairs_are_compared_with_the_same_rewritten_body(sim: ServerProcess, control_sim: ServerProcess,
                                                         tmp_path: Path) -> None:
    policy, secret, gateway_cm = shadow_gateway(tmp_path, sim.url, control_sim.url)
    with gateway_cm as gateway:
        ids = [stream_text(gateway, policy.keys["ab"], f"pair {index}")[1] for index in range(6)]
        counts = wait_counts(gateway, policy, 6)
        assert counts == {"compared": 6.0}
        report = admin_shadow(gateway, policy)
        assert report["pairs"] == 6
        assert report["compared_outputs"] == 6
        assert report["mismatches"] == 0
        assert report["ttft_pairs"] == 6
        assert "too few pairs" in report["verdict"]
        records = httpx.get(f"{control_sim.url}/sim/requests", timeout=10).json()["requests"]
        mirrored = {record["request_id"]: record for record in records}
        for request_id in ids:
            shadow = mirrored[f"{request_id}-shadow"]
            assert shadow["cache_salt"] == expected_salt(secret, "ab")
            assert shadow["kv_transfer_params"] == {"max_offload_tokens": 256}


def test_corrupted_arm_is_detected(sim: ServerProcess, corrupt_sim: ServerProcess, tmp_path: Path) -> None:
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, corrupt_sim.url)
    with gateway_cm as gateway:
        for index in range(4):
            stream_text(gateway, policy.keys["ab"], f"deterministic {index}")
        wait_counts(gateway, policy, 4)
        report = admin_shadow(gateway, policy)
        assert report["compared_outputs"] == 4
        assert report["mismatches"] == 4
        assert "mismatch" in report["verdict"]
        assert gateway.log_text().count("shadow_output_mismatch") == 4


@pytest.fixture(params=["stopped", "hang", "status500", "drop"])
def broken_shadow(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    mode: str = request.param
    port = free_port()
    if mode == "stopped":
        yield mode, f"http://127.0.0.1:{port}"
        return
    argv = [sys.executable, "-m", "tests.fault_upstream", "--port", str(port), "--mode", mode]
    with run_server(argv, port, tmp_path / "fault.log", ready_path="/health") as server:
        yield mode, server.url


def test_primary_is_unaffected_by_a_broken_shadow_pool(sim: ServerProcess, broken_shadow: tuple[str, str],
                                                       tmp_path: Path) -> None:
    mode, shadow_url = broken_shadow
    requests = 8
    policy, _, gateway_cm = shadow_gateway(tmp_path, sim.url, shadow_url, max_in_flight=2)
    with gateway_cm as gateway:
        for index in range(requests):
            prompt = f"unaffected {index}"
            with_shadow, _ = stream_text(gateway, policy.keys["ab"], prompt)
            without_shadow, _ = stream_text(gateway, policy.keys["plain"], prompt)
            assert generated(with_shadow) == generated(without_shadow) != ""
            assert with_shadow.endswith("data: [DONE]\n\n")
        expected_settled = 2 if mode == "hang" else requests
        counts = wait_counts(gateway, policy, expected_settled)
        if mode == "hang":
            assert counts == {"dropped": requests - 2.0}
        else:
            assert counts == {"error": float(requests)}


def test_a_primary_reply_past_the_shadow_bound_reaches_the_client_whole_and_gives_the_pair_up(
    control_sim: ServerProcess, tmp_path: Path
) -> None:
    """A 70 MiB streamed reply on the primary: the client gets every byte, while the gateway stops keeping it for
    the comparison at 64 MiB, so the pair is counted as a shadow error instead of the whole reply being held."""
    with upstream_module("tests.fault_upstream", tmp_path / "long.log", "--mode", "long-stream") as primary:
        policy, _, gateway_cm = shadow_gateway(tmp_path, primary.url, control_sim.url)
        with gateway_cm as gateway:
            body = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
                    "stream": True}
            received = 0
            with httpx.stream("POST", f"{gateway.url}/v1/chat/completions", json=body,
                              headers=bearer(policy.keys["ab"]), timeout=60) as reply:
                assert reply.status_code == 200
                for part in reply.iter_bytes():
                    received += len(part)
                    tail = part
            assert received > SHADOW_REPLY_BOUND and tail.endswith(b"data: [DONE]\n\n")
            assert wait_counts(gateway, policy, 1) == {"error": 1}
            assert "shadow_pair_incomplete" in gateway.log_text()
