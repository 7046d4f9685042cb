"""A simulated vLLM upstream and a real gateway process in front of it, shared by a test module."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess, free_port, free_port_pair, kvgate_command, run_server

SIM_MODEL = "sim-model"
UPSTREAM_KEY = "upstream-secret-key"
UPSTREAM_KEY_ENV = "UPSTREAM_TEST_KEY"


@dataclass
class Stack:
    """A gateway in front of one simulated upstream, with the keys the tests use."""

    gateway: ServerProcess
    sim: ServerProcess
    policy: PolicyDir
    secret: str

    @property
    def url(self) -> str:
        return self.gateway.url

    def key(self, tenant: str) -> str:
        return self.policy.keys[tenant]

    def client(self, tenant: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=bearer(self.key(tenant)), timeout=30.0)

    def sim_requests(self) -> list[dict[str, object]]:
        reply = httpx.get(f"{self.sim.url}/sim/requests", timeout=10).json()
        requests: list[dict[str, object]] = reply["requests"]
        return requests

    def sim_request(self, request_id: str) -> dict[str, object]:
        matches = [entry for entry in self.sim_requests() if entry.get("request_id") == request_id]
        assert len(matches) == 1, f"the simulator saw {len(matches)} requests with id {request_id}"
        return matches[0]


@contextmanager
def sim_process(log_dir: Path, *extra: str, api_key: str = UPSTREAM_KEY) -> Iterator[ServerProcess]:
    log_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv = kvgate_command("sim", "--port", str(port), f"--api-key={api_key}", *extra)
    with run_server(argv, port, log_dir / f"sim-{port}.log", ready_path="/health") as server:
        yield server


@contextmanager
def sim_with_kv_events(log_dir: Path) -> Iterator[tuple[ServerProcess, int]]:
    """A simulator publishing KV events on a free port pair (events, then replay); yields it and the events port."""
    events = free_port_pair()
    with sim_process(log_dir, "--gpu-blocks", "1024", "--kv-events-endpoint", f"tcp://*:{events}",
                     "--kv-events-replay-endpoint", f"tcp://*:{events + 1}") as server:
        yield server, events


def standard_policy(root: Path, sim_url: str) -> PolicyDir:
    pools = {"offload": {"upstreams": [sim_url], "api_key_env": UPSTREAM_KEY_ENV}}
    policy = PolicyDir(root, pools, public_paths=["/livez"])
    policy.add_tenant("acme", offload={"max_load_tokens": 4096, "max_offload_tokens": 1000})
    policy.add_tenant("beta", cache={"client_salt": "replace"})
    policy.add_tenant("gamma", cache={"isolation": "user"})
    policy.add_tenant("delta", measure_ttft=True)
    policy.add_tenant("ops", scopes=("metrics",))
    policy.add_tenant("root", scopes=("admin",))
    return policy


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with sim_process(tmp_path_factory.mktemp("sim")) as server:
        yield server


@pytest.fixture(scope="module")
def stack(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("gateway")
    policy = standard_policy(root / "policies", sim.url)
    policy.write()
    secret = new_secret()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY}
    with run_gateway(policy.root, root / "gateway.log", secret, env) as gateway:
        yield Stack(gateway=gateway, sim=sim, policy=policy, secret=secret)
