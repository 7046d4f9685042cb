"""The paired comparison sees the offload tier's effect on the simulator: a prefix that returns after GPU
eviction is loaded from the CPU tier on the offload arm and recomputed on control; unique prompts are not.

No time is measured here: what each arm did is read from the simulators' own records (`GET /sim/requests`:
tokens hit on GPU, loaded from CPU, and the TTFT model's planned prefill), and the pair's recorded cached-token
difference must equal it exactly. Speed itself belongs to the benchmarks under loadtests/.
"""

from __future__ import annotations

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
def ab_stack(tmp_path: Path) -> Iterator[tuple[ServerProcess, str, str, ServerProcess, ServerProcess]]:
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
            yield gateway, key, admin, offload, control


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
        if len(pairs) >= expected:
            return {pair["request_id"]: pair for pair in pairs}
        assert time.monotonic() < deadline, f"{len(pairs)} of {expected} pairs settled"
        time.sleep(0.05)  # polling until every shadow has settled


def sim_records(sim: ServerProcess) -> dict[str, dict[str, Any]]:
    records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
    return {record["request_id"]: record for record in records}


def test_returning_prefixes_are_loaded_on_the_offload_arm_only(
    ab_stack: tuple[ServerProcess, str, str, ServerProcess, ServerProcess],
) -> None:
    gateway, key, admin, offload, control = ab_stack
    returning, unique = [], []
    for round_no in range(3):
        prefix = text_of(f"doc{round_no}")
        ask(gateway, key, prefix + " first visit")
        unique += [ask(gateway, key, text_of(f"noise{round_no}x{n}")) for n in range(4)]
        returning.append(ask(gateway, key, prefix + " comes back"))
    pairs = pairs_by_id(gateway, admin, 3 + 12 + 3)
    primary, shadow = sim_records(offload), sim_records(control)
    for request_id in returning:
        arm, other = primary[request_id], shadow[f"{request_id}-shadow"]
        assert arm["loaded_tokens"] > 0 and arm["gpu_hit_tokens"] == 0  # evicted from GPU, back from CPU
        assert other["cached_tokens"] == 0  # control has no CPU tier: recomputed
        assert arm["planned_prefill_ms"] < other["planned_prefill_ms"]  # the TTFT model's plan, not a clock
        assert pairs[request_id]["cached_delta"] == arm["cached_tokens"]
    for request_id in unique:
        arm, other = primary[request_id], shadow[f"{request_id}-shadow"]
        assert arm["cached_tokens"] == other["cached_tokens"] == 0
        assert arm["planned_prefill_ms"] == other["planned_prefill_ms"]
        assert pairs[request_id]["cached_delta"] == 0
    assert all(pair["ttft_delta_s"] is not None for pair in pairs.values())  # both arms timed, value not judged
    assert all(pair["mismatch"] is False and pair["compared_output"] for pair in pairs.values())
