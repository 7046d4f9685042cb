"""The canary's schedule loop, owned by a TaskSupervisor, probes a pool whose interval has passed (the first
round runs at once) against a real simulator, and stops when the supervisor closes."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from gateway.canary.runner import CanaryRunner
from gateway.policy.loader import load_policy_set
from gateway.proxy.smallcalls import SmallCalls
from gateway.tasks import TaskSupervisor
from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, sim_process
from tests.harness import PolicyDir
from tests.procs import ServerProcess


@pytest.fixture
def lmcache_sim(tmp_path: Path) -> Iterator[ServerProcess]:
    with sim_process(tmp_path / "sim", "--lmcache") as server:
        yield server


def test_the_schedule_probes_due_pools_and_ends_with_its_supervisor(
    tmp_path: Path, lmcache_sim: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(UPSTREAM_KEY_ENV, UPSTREAM_KEY)
    canary = {"interval_s": 3600, "prefix_tokens": 256, "model": SIM_MODEL}
    upstream = {"upstreams": [lmcache_sim.url], "api_key_env": UPSTREAM_KEY_ENV}
    pools: dict[str, dict[str, Any]] = {
        "lm": {**upstream, "connector": "lmcache", "canary": canary},
        "quiet": upstream,  # no interval: never probed by the schedule
    }
    policy = PolicyDir(tmp_path / "policies", pools)
    policy.add_tenant("root", scopes=("admin",))
    policies = load_policy_set(policy.write(), os.environ)

    async def scenario() -> tuple[float, float, bool]:
        registry = CollectorRegistry()
        async with aiohttp.ClientSession() as session:
            runner = CanaryRunner(SmallCalls.using(session), b"schedule-secret", registry, tick_s=0.05)
            runner.prime(policies)
            tasks = TaskSupervisor("test")
            task = tasks.spawn(runner.schedule(lambda: policies), "canary")
            deadline = time.monotonic() + 20
            while registry.get_sample_value("kvgate_isolation_canary_total", {"pool": "lm", "result": "pass"}) != 1:
                assert time.monotonic() < deadline, runner.latest
                await asyncio.sleep(0.05)
            quiet = sum(registry.get_sample_value("kvgate_isolation_canary_total", {"pool": "quiet", "result": r})
                        or 0.0 for r in ("pass", "fail", "inconclusive", "error"))
            await tasks.close()
            lm_total = registry.get_sample_value("kvgate_isolation_canary_total", {"pool": "lm", "result": "pass"})
            return lm_total or 0.0, quiet, task.cancelled()

    lm_total, quiet, cancelled = asyncio.run(scenario())
    assert (lm_total, quiet, cancelled) == (1.0, 0.0, True)  # one round per interval; the other pool never ran
