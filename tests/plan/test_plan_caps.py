"""Offload caps in the trace: a tenant whose requests carry `max_offload_tokens` (policy cap; offload admission
sends 0 the same way) and one with `max_load_tokens` — the plan's predicted shares against a simulator each,
which honours both as vLLM's OffloadingConnector does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from gateway.devtools.loadtest.workload_run import WorkloadResult, WorkloadTarget, run_workload
from gateway.devtools.loadtest.workload_stack import WORKLOADS, kvgate_plan, sim_argv, started, wait_for_trace
from gateway.devtools.localproc import free_port, kvgate_command
from tests.harness import PolicyDir, new_secret

CPU_BYTES = 3_000_000_000
CAPS = {"offloadcap": {"max_offload_tokens": 512}, "loadcap": {"max_load_tokens": 320}}
EXACT = 0.005


def test_caps_are_modelled(tmp_path: Path) -> None:
    ports = {name: free_port() for name in CAPS}
    policies = PolicyDir(tmp_path / "policies", {n: {"upstreams": [f"http://127.0.0.1:{p}"]} for n, p in ports.items()})
    for name, caps in CAPS.items():
        policies.add_tenant(name, rollout={"pool": name}, offload=caps)
    policies.write()
    state, port = tmp_path / "state.sqlite3", free_port()
    env = {"KVGATE_SALT_SECRET": new_secret(), "KVGATE_STATE_PATH": str(state), "KVGATE_LOG_LEVEL": "warning"}
    spec = WORKLOADS["hot"].model_copy(update={"requests": 80})
    sims = {name: (sim_argv(port_, CPU_BYTES), port_) for name, port_ in ports.items()}
    gateway_argv = kvgate_command("serve", "--policies", str(policies.root), "--port", str(port))
    with started(sims, tmp_path, "/health") as servers, \
            started({"gateway": (gateway_argv, port)}, tmp_path, "/livez", env) as gateway:
        async def drive() -> list[WorkloadResult]:
            async with httpx.AsyncClient(timeout=60.0) as http:
                return list(await asyncio.gather(*[
                    run_workload(http, WorkloadTarget(gateway["gateway"].url, policies.keys[name], "m", 1,
                                                      f"{servers[name].url}/metrics"), spec) for name in CAPS]))

        measured = dict(zip(CAPS, asyncio.run(drive()), strict=True))
        for name in CAPS:
            wait_for_trace(state, name, spec.requests)
            plan = kvgate_plan(state, "--tenant", name, "--metrics", f"{servers[name].url}/metrics",
                               "--cpu-bytes", str(CPU_BYTES))
            point, result = plan["evaluated"][0], measured[name]
            assert result.cpu_share is not None and result.cpu_share > 0.02, name  # the tier does serve some
            assert abs(point["cpu_share"] - result.cpu_share) <= EXACT, (name, point, result.to_json())
            assert abs(point["gpu_share"] - (result.gpu_share or 0)) <= EXACT, name
            assert any("max_offload_tokens" in n or "max_load_tokens" in n for n in plan["notes"]), plan["notes"]
