"""The paired comparison reproduces the offload tier's known effect on the simulator: a prefix that
returns after GPU eviction is faster on the offload arm (negative ΔTTFT); unique prompts are not.

Why this cannot flake: the simulator charges 40 µs per computed prompt token and 4 µs per token loaded from
its CPU tier, so a returning 1,500-token prefix differs by about 54 ms between the arms, while unique prompts
cost the same on both; the assertions compare the two groups, not absolute times.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess

CONTROL_KEY, CONTROL_KEY_ENV = "control-key", "UPSTREAM_TEST_CONTROL_KEY"
GPU_BLOCKS = "256"  # 4,096 tokens: four 1,500-token prompts push an earlier prefix out
PREFIX_TOKENS = 1500


def text_of(tag: str) -> str:
    return (f"{tag} " * PREFIX_TOKENS)[:PREFIX_TOKENS]  # the simulator's tokenizer is one token per byte


@pytest.fixture
def ab_stack(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str]]:
    with sim_process(tmp_path / "offload", "--offload", "--gpu-blocks", GPU_BLOCKS) as offload, \
         sim_process(tmp_path / "control", "--gpu-blocks", GPU_BLOCKS, api_key=CONTROL_KEY) as control:
        pools = {"offload": {"upstreams": [offload.url], "api_key_env": UPSTREAM_KEY_ENV},
                 "control": {"upstreams": [control.url], "api_key_env": CONTROL_KEY_ENV}}
        policy = PolicyDir(tmp_path / "policies", pools)
        key = policy.add_tenant("ab", shadow={"pool": "control", "sample": 1.0, "max_in_flight": 8})
        admin = policy.add_tenant("root", scopes=("admin",))
        policy.write()
        env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, CONTROL_KEY_ENV: CONTROL_KEY}
        with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env) as gateway:
            yield gateway, key, admin


def ask(gateway: ServerProcess, key: str, prompt: str) -> str:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=60) as reply:
        assert reply.status_code == 200
        b"".join(reply.iter_bytes())
        return reply.headers["x-request-id"]


def pairs_by_id(gateway: ServerProcess, admin: str, expected: int) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        reply = httpx.get(f"{gateway.url}/admin/shadow?pairs=500", headers=bearer(admin), timeout=30).json()
        pairs = reply["tenants"]["ab"]["recent_pairs"]
        if len(pairs) >= expected or time.monotonic() > deadline:
            return {pair["request_id"]: pair for pair in pairs}
        time.sleep(0.05)  # polling until every shadow has settled


def test_returning_prefixes_favour_the_offload_arm(ab_stack: tuple[ServerProcess, str, str]) -> None:
    gateway, key, admin = ab_stack
    returning, unique = [], []
    for round_no in range(3):
        prefix = text_of(f"doc{round_no}")
        ask(gateway, key, prefix + " first visit")
        unique += [ask(gateway, key, text_of(f"noise{round_no}x{n}")) for n in range(4)]
        returning.append(ask(gateway, key, prefix + " comes back"))
    pairs = pairs_by_id(gateway, admin, 3 + 12 + 3)
    back = [pairs[request_id]["ttft_delta_s"] for request_id in returning]
    fresh = [pairs[request_id]["ttft_delta_s"] for request_id in unique]
    assert all(delta < 0 for delta in back), back
    assert statistics.median(abs(delta) for delta in fresh) < 0.5 * statistics.median(abs(delta) for delta in back)
    assert all(pair["mismatch"] is False and pair["compared_output"] for pair in pairs.values())
