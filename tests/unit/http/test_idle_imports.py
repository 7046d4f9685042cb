"""An idle gateway does not load the clients of features it does not use (issue 15's idle-RSS target).

aiohttp serves only the gateway's own small upstream calls (canary probes, miss-path `/version` probes, the plan's
`/metrics` read, admin routes forwarded between workers) and is opened by the first of them; the Redis client is
loaded only when the state is kept in Redis, pyzmq only when a pool names a KV-event source, the planner with
the first plan asked for; `kvgate serve` imports no other command's module. Each costs
megabytes of resident memory that a gateway without those features would carry for nothing
(loadtests/idle_memory.py measures how much). The gateway starts in a child interpreter
(tests/unit/http/idle_imports_child.py) as `kvgate serve` starts it, and reports its modules once it is up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gateway.conftest import UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy
from tests.ledger.redis_proc import RedisProcess
from tests.salt_vectors import GATEWAY_SECRET

# Loaded only by a feature that is configured and used (or by another command than `serve`).
LAZY = ("aiohttp", "redis", "zmq", "httpx", "gateway.sim", "gateway.devtools", "gateway.cli.doctor",
        "gateway.cli.loadtest", "gateway.cli.audit", "gateway.shadow.cli", "gateway.plan", "gateway.ledger.redis_store")


def idle_modules(tmp_path: Path, *flags: str, env: dict[str, str] | None = None,
                 kv_events: list[str] | None = None) -> set[str]:
    policy = standard_policy(tmp_path / "policies", "http://127.0.0.1:9")  # no upstream is contacted
    if kv_events:
        policy.gateway["pools"]["offload"]["kv_events"] = kv_events
    policy.add_tenant("retrying", offload={"miss_path": "retry"})  # configured; nothing has failed, so no probe
    policy.write()
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("KVGATE_")}
    child_env = {**inherited, UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_SALT_SECRET": GATEWAY_SECRET,
                 "KVGATE_STATE_PATH": str(tmp_path / "state.sqlite3"), **(env or {})}
    child = subprocess.run([sys.executable, "-m", "tests.unit.http.idle_imports_child", str(policy.root), *flags],
                           capture_output=True, text=True, timeout=120, env=child_env)
    assert child.returncode == 0, child.stderr[-3000:]
    return set(json.loads(child.stdout.strip().splitlines()[-1]))


def loaded(modules: set[str], name: str) -> bool:
    return name in modules or any(module.startswith(f"{name}.") for module in modules)


def test_an_idle_gateway_without_redis_or_small_calls_loads_none_of_their_clients(tmp_path: Path) -> None:
    modules = idle_modules(tmp_path)
    assert "gateway.http.app" in modules and "uvicorn" in modules  # it did start as `kvgate serve`
    assert [name for name in LAZY if loaded(modules, name)] == []


def test_the_first_small_call_loads_aiohttp(tmp_path: Path) -> None:
    modules = idle_modules(tmp_path, "--small-call")
    assert loaded(modules, "aiohttp")
    assert not loaded(modules, "redis")


def test_a_kv_event_source_loads_pyzmq(tmp_path: Path) -> None:
    modules = idle_modules(tmp_path, kv_events=["tcp://127.0.0.1:9"])  # a ZMQ connect needs no listener
    assert loaded(modules, "zmq")
    assert not loaded(modules, "aiohttp")


@pytest.mark.redis
def test_state_in_redis_loads_the_redis_client(tmp_path: Path, redis_server: RedisProcess) -> None:
    modules = idle_modules(tmp_path, env={"KVGATE_REDIS_URL": redis_server.url})
    assert loaded(modules, "redis") and loaded(modules, "gateway.ledger.redis_store")
    assert not loaded(modules, "aiohttp")
