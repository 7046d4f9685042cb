"""Reuse scenarios (`kind: reuse`): replay one reuse workload at several CPU-tier sizes and compare what
`kvgate plan` predicts with what the server measures.

For each `cpu_bytes_to_use` value: a fresh server with that tier (a self-started simulator, or the real
server restarted by `--restart-cmd offload=CMD`, which runs with `CPU_BYTES=<value>` in its environment), the
workload through the gateway, then the server's counters (GPU prefix-cache hits, connector hits, prompt
tokens, offload bytes) and the gateway's `GET /admin/plan?since=<run start>&cpu_bytes=<value>`. The report puts
predicted and measured shares side by side.

    kvgate loadtest loadtests/scenarios/plan-sim.yaml                      # simulators, started here
    kvgate loadtest loadtests/scenarios/plan-h200.yaml --gateway URL --access keys.json \\
        --upstream offload=http://127.0.0.1:8000 --restart-cmd "offload=bash scripts/gpu/vllm_server.sh restart offload"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.devtools.loadtest.model import ScenarioError, policy_tenant_name
from gateway.devtools.loadtest.stack import OwnedServer
from gateway.devtools.loadtest.targets import Access, TenantAccess, wait_healthy
from gateway.devtools.loadtest.workload_run import WorkloadResult, WorkloadTarget, run_workload
from gateway.devtools.loadtest.workloads import WorkloadSpec
from gateway.devtools.localproc import free_port, kvgate_command
from gateway.keys import hash_key, new_key


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ReuseSim(Strict):
    gpu_blocks: int = Field(default=1271, gt=0)
    args: list[str] = Field(default_factory=list)


class ReuseScenario(Strict):
    kind: str = Field(pattern="^reuse$")
    name: str
    description: str = ""
    model: str = "m"
    tenant: str = "acme"
    pool: str = "offload"
    max_tokens: int = Field(default=1, gt=0)
    workload: WorkloadSpec
    cpu_bytes_to_use: list[int] = Field(min_length=1)
    tolerance: float = Field(default=0.03, gt=0)  # the largest predicted-vs-measured difference called a match
    request_timeout_s: float = Field(default=120.0, gt=0)
    restart_timeout_s: float = Field(default=300.0, gt=0)
    sim: ReuseSim = Field(default_factory=ReuseSim)

    _policy_name = field_validator("tenant")(policy_tenant_name)


def is_reuse_file(path: Path) -> bool:
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and raw.get("kind") == "reuse"


def load_reuse_scenario(path: Path) -> ReuseScenario:
    try:
        return ReuseScenario.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise ScenarioError(f"{path}: {error}") from error


def write_reuse_policies(root: Path, scenario: ReuseScenario, upstream: str) -> Access:
    """One pool and one tenant (with an admin key beside its inference key)."""
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    gateway = {"pools": {scenario.pool: {"upstreams": [upstream]}}, "default_pool": scenario.pool,
               "public_paths": ["/livez"]}
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    key, admin = new_key(), new_key()
    tenant = {"tenant": scenario.tenant, "keys": [{"sha256": hash_key(key), "scopes": ["inference"]},
                                                  {"sha256": hash_key(admin), "scopes": ["admin", "metrics"]}],
              "rollout": {"pool": scenario.pool}}
    (root / "tenants" / f"{scenario.tenant}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return Access(admin, {scenario.tenant: TenantAccess(key, {})})


@dataclass
class Target:
    gateway: str
    upstream: str
    access: Access
    restart: str | None  # shell command, run with CPU_BYTES set


@contextmanager
def self_started(scenario: ReuseScenario, workdir: Path, cpu_bytes: int) -> Iterator[Target]:
    """A simulator with this tier and a gateway with a fresh store, for one run."""
    workdir.mkdir(parents=True, exist_ok=True)
    sim_port, gateway_port = free_port(), free_port()
    sim = OwnedServer(kvgate_command("sim", "--port", str(sim_port), "--model", scenario.model, "--gpu-blocks",
                                     str(scenario.sim.gpu_blocks), "--offload", "--cpu-bytes-to-use", str(cpu_bytes),
                                     *scenario.sim.args), sim_port, workdir / "sim.log")
    access = write_reuse_policies(workdir / "policies", scenario, sim.url)
    env = {"KVGATE_SALT_SECRET": secrets.token_hex(32), "KVGATE_STATE_PATH": str(workdir / "state.sqlite3")}
    gateway = OwnedServer(kvgate_command("serve", "--policies", str(workdir / "policies"), "--port",
                                         str(gateway_port)), gateway_port, workdir / "gateway.log", env, "/livez")
    with ExitStack() as cleanup:
        for server in (sim, gateway):
            cleanup.callback(server.stop)
            server.start()
        yield Target(gateway.url, sim.url, access, None)


async def one_run(scenario: ReuseScenario, target: Target, cpu_bytes: int) -> dict[str, Any]:
    timeout = httpx.Timeout(scenario.request_timeout_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as http:
        if target.restart is not None:
            _restart(target.restart, cpu_bytes)
            await asyncio.to_thread(wait_healthy, target.upstream, scenario.restart_timeout_s)
        started = time.time()
        key = target.access.tenants[scenario.tenant].key
        sent_to = WorkloadTarget(target.gateway, key, scenario.model, scenario.max_tokens, f"{target.upstream}/metrics")
        result = await run_workload(http, sent_to, scenario.workload)
        plan = await _plan(http, target, scenario, started, cpu_bytes)
    return {"cpu_bytes_to_use": cpu_bytes, "measured": result.to_json(), "plan": plan,
            "comparison": compare(plan, result, scenario.tolerance)}


def _restart(command: str, cpu_bytes: int) -> None:
    done = subprocess.run(command, shell=True, env={**os.environ, "CPU_BYTES": str(cpu_bytes)},  # noqa: S602
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"restart command failed ({done.returncode}): {done.stderr[-400:]}")


async def _plan(http: httpx.AsyncClient, target: Target, scenario: ReuseScenario, since: float,
                cpu_bytes: int) -> dict[str, Any]:
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since - 1)) + "Z"
    query = {"tenant": scenario.tenant, "since": iso, "cpu_bytes": str(cpu_bytes), "pool": scenario.pool}
    reply = await http.get(f"{target.gateway}/admin/plan", params=query,
                           headers={"Authorization": f"Bearer {target.access.admin_key}"})
    reply.raise_for_status()
    plan: dict[str, Any] = reply.json()
    return plan


def compare(plan: dict[str, Any], result: WorkloadResult, tolerance: float) -> dict[str, Any]:
    point = (plan.get("evaluated") or [None])[0]
    measured = {"gpu_share": result.gpu_share, "cpu_share": result.cpu_share}
    if point is None:
        return {"predicted": None, "measured": measured, "match": None,
                "why": "the plan made no prediction (see its warnings)"}
    predicted = {"gpu_share": point["gpu_share"], "cpu_share": point["cpu_share"], "error_bound": point["error_bound"]}
    differences = {name: (predicted[name] - value if value is not None else None) for name, value in measured.items()}
    known = [abs(d) for d in differences.values() if d is not None]
    return {"predicted": predicted, "measured": measured, "difference": differences,
            "match": bool(known) and len(known) == len(differences) and max(known) <= tolerance,
            "kv_bytes_per_token": plan["kv"]["bytes_per_token"],
            "server_kv_bytes_per_token": plan["kv"]["server_bytes_per_token"],
            "cpu_share_from_load_bytes": _load_bytes_share(plan, result)}


def _load_bytes_share(plan: dict[str, Any], result: WorkloadResult) -> float | None:
    """The CPU tier's share again, from `vllm:kv_offload_load_bytes_total` ÷ KV bytes per token (a cross-check
    that does not depend on the connector-hit counter)."""
    loaded = result.upstream_delta.get("vllm:kv_offload_load_bytes_total")
    per_token = plan["kv"]["bytes_per_token_all_ranks"]
    if not loaded or not per_token or not result.prompt_tokens:
        return None
    return float(loaded / per_token / result.prompt_tokens)


def render_markdown(report: dict[str, Any]) -> str:
    lines = [f"# {report['scenario']['name']}: predicted vs measured token shares", "",
             report["scenario"].get("description", "").strip(), "",
             "| cpu_bytes_to_use | GPU predicted | GPU measured | CPU tier predicted | CPU tier measured | "
             "CPU tier from load bytes | usage cached | match |", "|---|---|---|---|---|---|---|---|"]
    for run in report["runs"]:
        comparison = run["comparison"]
        predicted = comparison.get("predicted") or {}
        measured = comparison["measured"]
        lines.append(f"| {run['cpu_bytes_to_use']:,} | {_pct(predicted.get('gpu_share'))} | "
                     f"{_pct(measured['gpu_share'])} | {_pct(predicted.get('cpu_share'))} | "
                     f"{_pct(measured['cpu_share'])} | {_pct(comparison.get('cpu_share_from_load_bytes'))} | "
                     f"{_pct(run['measured']['usage_cached_share'])} | "
                     f"{comparison['match']} |")
    lines += ["", f"Tolerance: {report['scenario']['tolerance'] * 100:.0f} percentage points. Measured: "
              "`vllm:prefix_cache_hits_total` (GPU) and `vllm:external_prefix_cache_hits_total` (CPU tier) over "
              "`vllm:prompt_tokens_total`, as deltas around each run; the cross-check divides "
              "`vllm:kv_offload_load_bytes_total` by the KV bytes per token.", ""]
    first = report["runs"][0]["plan"]["kv"] if report["runs"] else {}
    if first:
        lines.append(f"KV bytes per token: plan {first.get('bytes_per_token')}, server "
                     f"{first.get('server_bytes_per_token')} (`vllm:cache_config_info`).")
    return "\n".join(lines) + "\n"


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value * 100:.1f} %"


def save(report: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))


def run_reuse(args: argparse.Namespace, default_out: Path) -> int:
    """`kvgate loadtest` for a `kind: reuse` file (flags as for the A/B protocol; only the offload arm is used)."""
    try:
        scenario = load_reuse_scenario(args.scenario)
        upstreams = dict(args.upstream)
        if args.write_policies is not None:
            if "offload" not in upstreams:
                raise ScenarioError("--write-policies needs --upstream offload=URL")
            write_reuse_policies(args.write_policies, scenario, upstreams["offload"]).save(
                args.write_policies / "keys.json")
            print(f"wrote {args.write_policies}/gateway.yaml, tenants/ and keys.json (plain keys: keep it private)")
            return 0
        out = args.out or default_out
        runs = [_run_value(args, scenario, upstreams, out, cpu_bytes) for cpu_bytes in scenario.cpu_bytes_to_use]
    except (ScenarioError, OSError, RuntimeError, TimeoutError, httpx.HTTPError) as error:
        print(f"kvgate loadtest: {error}", file=sys.stderr)
        return 1
    report = {"scenario": scenario.model_dump(mode="json"), "runs": runs,
              "all_match": all(run["comparison"]["match"] for run in runs)}
    save(report, out)
    sys.stdout.write(render_markdown(report))
    print(f"\nreport: {out / 'report.md'}, raw data: {out / 'report.json'}")
    return 0


def _run_value(args: argparse.Namespace, scenario: ReuseScenario, upstreams: dict[str, str], out: Path,
               cpu_bytes: int) -> dict[str, Any]:
    print(f"{scenario.name}: {scenario.workload.requests} requests with a {cpu_bytes:,}-byte CPU tier", flush=True)
    if args.gateway is None:
        with self_started(scenario, out / "stack" / str(cpu_bytes), cpu_bytes) as target:
            return asyncio.run(one_run(scenario, target, cpu_bytes))
    if args.access is None or "offload" not in upstreams:
        raise ScenarioError("--gateway needs --access keys.json and --upstream offload=URL")
    restart = dict(args.restart_cmd).get("offload")
    if restart is None and len(scenario.cpu_bytes_to_use) > 1:
        raise ScenarioError("several cpu_bytes_to_use values need --restart-cmd offload=CMD (run with CPU_BYTES set)")
    target = Target(args.gateway.rstrip("/"), upstreams["offload"].rstrip("/"), Access.load(args.access), restart)
    return asyncio.run(one_run(scenario, target, cpu_bytes))
