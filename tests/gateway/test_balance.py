"""Several upstreams in a pool: a salt+prefix sticks to one upstream while it is healthy."""

from __future__ import annotations

from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir, bearer, run_gateway
from tests.procs import ServerProcess

FIXED_SECRET = "affinity-test-secret-of-32-bytes!"
# Ports are random, so which upstream holds a prefix differs between runs: the test observes the placement and
# then stops the upstream holding the most prefixes, so the failover check runs on every run.
PREFIXES = [f"shared document number {index} " * 12 for index in range(8)]
MORE_PREFIXES = [f"extra document number {index} " * 12 for index in range(24)]


def upstream_of(sims: list[ServerProcess], request_id: str) -> str:
    for sim in sims:
        records = httpx.get(f"{sim.url}/sim/requests", timeout=10).json()["requests"]
        if any(record["request_id"] == request_id for record in records):
            return sim.url
    raise AssertionError(f"no simulator saw {request_id}")


def ask(gateway: ServerProcess, key: str, prompt: str) -> str:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 1}
    reply = httpx.post(f"{gateway.url}/v1/completions", json=body, headers=bearer(key), timeout=30)
    assert reply.status_code == 200
    return reply.headers["x-request-id"]


def test_prefix_affinity_and_failover(tmp_path: Path) -> None:
    with ExitStack() as stack:
        sims = [stack.enter_context(sim_process(tmp_path / f"s{index}")) for index in range(3)]
        policy = PolicyDir(tmp_path / "policies",
                           {"offload": {"upstreams": [s.url for s in sims], "api_key_env": UPSTREAM_KEY_ENV}})
        key = policy.add_tenant("acme")
        policy.write()
        gateway = stack.enter_context(
            run_gateway(policy.root, tmp_path / "gateway.log", FIXED_SECRET, {UPSTREAM_KEY_ENV: UPSTREAM_KEY}))
        placement: dict[str, str] = {}
        for prefix in PREFIXES + MORE_PREFIXES:
            if prefix in MORE_PREFIXES and len(set(placement.values())) >= 2:
                break  # (the chance that 8 prefixes all land on one of 3 upstreams is 3 / 3**8)
            seen = {upstream_of(sims, ask(gateway, key, prefix + f"question {n}")) for n in range(3)}
            assert len(seen) == 1, prefix
            placement[prefix] = seen.pop()
        assert len(set(placement.values())) >= 2
        busiest = Counter(placement.values()).most_common(1)[0][0]
        stopped = next(sim for sim in sims if sim.url == busiest)
        stopped.stop()
        alive = [sim for sim in sims if sim is not stopped]
        for prefix, before in placement.items():
            now = upstream_of(alive, ask(gateway, key, prefix + "after failover"))
            if before != stopped.url:
                assert now == before, "a prefix whose upstream stayed up moved"
