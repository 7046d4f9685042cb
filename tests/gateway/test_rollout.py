"""Rollout through a real gateway: the split matches `percent`, users stick, and raising `percent`
on reload only moves users toward the target pool."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess

USERS = [f"user-{index}" for index in range(2000)]
Z_BOUND = 4.5  # a fair draw lands outside ±4.5 standard deviations with probability below 1e-5


@pytest.fixture
def split_gateway(sim: ServerProcess, tmp_path: Path) -> Iterator[tuple[ServerProcess, PolicyDir]]:
    # Both pools point at the same simulator: the test reads the pool from x-kvgate-pool.
    pools = {name: {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV} for name in ("offload", "control")}
    policy = PolicyDir(tmp_path / "policies", pools, public_paths=["/livez"])
    policy.add_tenant("split", rollout={"pool": "offload", "percent": 30, "else_pool": "control", "sticky": "user"})
    policy.add_tenant("root", scopes=("admin",))
    policy.write()
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield gateway, policy


async def _pools(gateway: ServerProcess, key: str, users: list[str]) -> dict[str, str]:
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=gateway.url, headers=bearer(key), timeout=30) as client:
        async def one(user: str) -> tuple[str, str]:
            body = {"model": SIM_MODEL, "prompt": "p", "max_tokens": 1, "user": user}
            async with limit:
                reply = await client.post("/v1/completions", json=body)
            assert reply.status_code == 200
            return user, reply.headers["x-kvgate-pool"]
        return dict(await asyncio.gather(*(one(user) for user in users)))


def pools_of(gateway: ServerProcess, policy: PolicyDir, users: list[str]) -> dict[str, str]:
    return asyncio.run(_pools(gateway, policy.keys["split"], users))


def assert_share(assignment: dict[str, str], percent: float) -> None:
    n, p = len(assignment), percent / 100
    on_target = sum(1 for pool in assignment.values() if pool == "offload")
    assert abs(on_target - n * p) <= Z_BOUND * math.sqrt(n * p * (1 - p)), (on_target, n, p)


def raise_percent(gateway: ServerProcess, policy: PolicyDir, percent: int) -> None:
    def version() -> str:
        reply = httpx.get(f"{gateway.url}/admin/policies", headers=bearer(policy.keys["root"]), timeout=10)
        value: str = reply.json()["policy_version"]
        return value
    old = version()
    policy.tenants["split"]["rollout"]["percent"] = percent
    policy.write_tenant("split", policy.tenants["split"])
    deadline = time.monotonic() + 20
    while version() == old and time.monotonic() < deadline:
        time.sleep(0.05)  # polling until the reload is in force
    assert version() != old


def test_split_matches_percent_and_is_sticky_and_monotone(split_gateway: tuple[ServerProcess, PolicyDir]) -> None:
    gateway, policy = split_gateway
    first = pools_of(gateway, policy, USERS)
    assert_share(first, 30)
    again = pools_of(gateway, policy, USERS[:300])
    assert all(again[user] == first[user] for user in again)
    raise_percent(gateway, policy, 60)
    after = pools_of(gateway, policy, USERS)
    assert_share(after, 60)
    assert [user for user in USERS if first[user] == "offload" and after[user] != "offload"] == []
    assert sum(1 for user in USERS if first[user] == "control" and after[user] == "offload") > 0


def test_requests_without_user_are_drawn_per_request(split_gateway: tuple[ServerProcess, PolicyDir]) -> None:
    gateway, policy = split_gateway
    body = {"model": SIM_MODEL, "prompt": "p", "max_tokens": 1}
    with httpx.Client(base_url=gateway.url, headers=bearer(policy.keys["split"]), timeout=30) as client:
        pools = [client.post("/v1/completions", json=body).headers["x-kvgate-pool"] for _ in range(400)]
    on_target = pools.count("offload")
    assert abs(on_target - 120) <= Z_BOUND * math.sqrt(400 * 0.3 * 0.7)


def test_user_header_names_the_user(sim: ServerProcess, tmp_path: Path) -> None:
    pools = {name: {"upstreams": [sim.url], "api_key_env": UPSTREAM_KEY_ENV} for name in ("offload", "control")}
    policy = PolicyDir(tmp_path / "policies", pools)
    key = policy.add_tenant("hdr", rollout={"pool": "offload", "percent": 50, "else_pool": "control",
                                            "user_header": "X-End-User"})
    policy.write()
    with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gw, \
         httpx.Client(base_url=gw.url, headers=bearer(key), timeout=30) as client:
        def pool(user: str, body_user: str) -> str:
            body = {"model": SIM_MODEL, "prompt": "p", "max_tokens": 1, "user": body_user}
            return client.post("/v1/completions", json=body, headers={"X-End-User": user}).headers["x-kvgate-pool"]
        for index in range(40):
            user = f"person-{index}"
            # The header decides: the body's user field changes nothing.
            assert len({pool(user, f"body-{n}") for n in range(3)}) == 1
        assert len({pool(f"person-{index}", "same") for index in range(40)}) == 2
