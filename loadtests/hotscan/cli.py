"""`python -m loadtests.hotscan SCENARIO`: admission off (`all`) and on (`returning`) on the hot-plus-scan workload.

    # on simulators, started here (one offload simulator per arm, so the arms cannot disturb each other)
    python -m loadtests.hotscan loadtests/scenarios/admission-sim.yaml --out DIR
    # against a running offload server (real vLLM): policies and keys first, then the run
    python -m loadtests.hotscan SCENARIO --write-policies DIR --upstream http://127.0.0.1:8000
    python -m loadtests.hotscan SCENARIO --gateway http://127.0.0.1:8080 --access DIR/keys.json \\
        --upstream http://127.0.0.1:8000 [--restart-cmd "bash scripts/gpu/vllm_server.sh restart offload"]

Against one real server the arms run one after the other; `--restart-cmd` (run before each arm after the first,
then /health is awaited: a restart, or an in-place reset of the GPU cache and CPU tier) gives each arm empty
caches. Without it the second arm starts with the first arm's blocks in the tier (another salt, so never hit;
the report says so). A `server:` block in the scenario (read on the GPU host by scripts/gpu/runplan.py) is
ignored here.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.devtools.loadtest.promtext import accumulating_samples
from gateway.devtools.loadtest.stack import OwnedServer
from gateway.devtools.loadtest.targets import wait_healthy
from gateway.devtools.localproc import free_port, kvgate_command
from gateway.keys import hash_key, new_key
from loadtests.hotscan.run import Arm, render_summary, run_arm, write_report
from loadtests.hotscan.workload import Answer, ArmSummary, HotScan

ARMS = ("all", "returning")
UPSTREAM_KEY_ENV = "VLLM_HOTSCAN_UPSTREAM_KEY"
RESTART_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Scenario:
    name: str
    model: str
    workload: HotScan
    max_tokens: int
    arms: dict[str, dict[str, Any]]  # arm -> tenant policy overrides (its `offload` section)
    sim: dict[str, Any] = field(default_factory=dict)  # flags for self-started simulators
    kv_bytes_per_token: int | None = 147456  # the served model's KV size (default: the Qwen3-8B shape)

    @classmethod
    def load(cls, path: Path) -> Scenario:
        data: dict[str, Any] = yaml.safe_load(path.read_text())
        arms = data.get("arms") or {}
        if set(arms) != set(ARMS):
            raise ValueError(f"{path}: arms must be exactly {list(ARMS)}")
        return cls(str(data["name"]), str(data.get("model", "m")), HotScan(**data.get("workload", {})),
                   int(data.get("max_tokens", 4)), arms, dict(data.get("sim") or {}),
                   data.get("kv_bytes_per_token", 147456))


def tenant_name(arm: str) -> str:
    return f"hotscan-{arm}"


def write_policies(
    root: Path, scenario: Scenario, upstreams: dict[str, str], api_key_env: str | None
) -> dict[str, str]:
    """gateway.yaml (a pool per arm), one tenant per arm, and keys.json (plain keys: owner-only)."""
    pools: dict[str, Any] = {}
    for arm, url in upstreams.items():
        pools[f"pool-{arm}"] = {"upstreams": [url], **({"api_key_env": api_key_env} if api_key_env else {})}
    # /metrics is public so the runner can read the admission and miss-path counters without another key.
    gateway = {"pools": pools, "default_pool": next(iter(pools)), "public_paths": ["/livez", "/metrics"]}
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    keys: dict[str, str] = {}
    for arm, override in scenario.arms.items():
        key = new_key()
        keys[arm] = key
        tenant = {"tenant": tenant_name(arm), "keys": [{"sha256": hash_key(key), "scopes": ["inference"]}],
                  "offload": override.get("offload", {}), "rollout": {"pool": f"pool-{arm}"}}
        (root / "tenants" / f"{tenant_name(arm)}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    descriptor = os.open(root / "keys.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(keys, handle)
    return keys


def sim_flags(scenario: Scenario) -> list[str]:
    sim = scenario.sim
    flags = ["--offload", "--model", scenario.model, "--gpu-blocks", str(sim.get("gpu_blocks", 128)),
             "--cpu-bytes-to-use", str(sim.get("cpu_bytes_to_use", 12_000_000_000)), "--record-limit", "1000"]
    return flags + [str(arg) for arg in sim.get("args", [])]


@contextmanager
def self_started(scenario: Scenario, workdir: Path) -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """One simulator per arm and a gateway: (gateway URL, arm -> key, arm -> upstream URL)."""
    workdir.mkdir(parents=True, exist_ok=True)
    upstream_key = secrets.token_urlsafe(16)
    with ExitStack() as cleanup:
        upstreams: dict[str, str] = {}
        for arm in ARMS:
            port = free_port()
            argv = kvgate_command("sim", "--port", str(port), f"--api-key={upstream_key}", *sim_flags(scenario))
            server = OwnedServer(argv, port, workdir / f"sim-{arm}.log")
            cleanup.callback(server.stop)
            server.start()
            upstreams[arm] = server.url
        keys = write_policies(workdir / "policies", scenario, upstreams, UPSTREAM_KEY_ENV)
        port = free_port()
        env = {UPSTREAM_KEY_ENV: upstream_key, "KVGATE_SALT_SECRET": secrets.token_hex(32),
               "KVGATE_STATE_PATH": str(workdir / "state.sqlite3"), "KVGATE_LOG_FORMAT": "json"}
        gateway = OwnedServer(kvgate_command("serve", "--policies", str(workdir / "policies"), "--port", str(port)),
                              port, workdir / "gateway.log", env, ready_path="/livez")
        cleanup.callback(gateway.stop)
        gateway.start()
        yield gateway.url, keys, upstreams


def run_arms(scenario: Scenario, gateway: str, keys: dict[str, str], upstreams: dict[str, str], sim: bool,
             restart_cmd: str | None) -> tuple[list[ArmSummary], dict[str, list[Answer]], list[str]]:
    summaries: list[ArmSummary] = []
    answers: dict[str, list[Answer]] = {}
    notes: list[str] = []
    for index, arm in enumerate(ARMS):
        if index and restart_cmd:
            subprocess.run(shlex.split(restart_cmd), check=True)
            wait_healthy(upstreams[arm], RESTART_TIMEOUT_S)
            notes.append(f"--restart-cmd ran before arm {arm!r} (caches emptied), then /health answered")
        elif index and upstreams[arm] == upstreams[ARMS[0]]:
            notes.append(f"arm {arm!r} ran on the same server after {ARMS[0]!r} without a restart: its CPU tier "
                         "started full of the other arm's blocks (other salt, never hit; evicted first)")
        got, summary = run_arm(Arm(arm, gateway, keys[arm], upstreams[arm], sim), scenario.workload, scenario.model,
                               scenario.max_tokens, kv_bytes_per_token=scenario.kv_bytes_per_token)
        summary.gateway_counters = gateway_counters(gateway, tenant_name(arm))
        summaries.append(summary)
        answers[arm] = got
    return summaries, answers, notes


def gateway_counters(gateway: str, tenant: str) -> dict[str, float]:
    """The tenant's admission decisions and miss-path retries, from the gateway's /metrics (cumulative)."""
    samples = accumulating_samples(httpx.get(f"{gateway}/metrics", timeout=30).text)
    wanted = ("kvgate_offload_admission_total", "kvgate_miss_path_total")
    return {key: value for key, value in samples.items()
            if key.partition("{")[0] in wanted and f'tenant="{tenant}"' in key}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.hotscan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", type=Path)
    parser.add_argument("--out", type=Path, default=None, help="report folder (default loadtests/reports/<name>)")
    parser.add_argument("--gateway", help="a running gateway (else simulators and a gateway are started here)")
    parser.add_argument("--access", type=Path, help="keys.json written by --write-policies")
    parser.add_argument("--upstream", help="the offload server both arms' pools point at")
    parser.add_argument("--restart-cmd", help="run before the second arm (then /health is awaited)")
    parser.add_argument("--write-policies", type=Path, help="write a policy directory and keys.json, then exit")
    parser.add_argument("--api-key-env", help="with --write-policies: the variable holding the upstream's key")
    args = parser.parse_args(argv)
    scenario = Scenario.load(args.scenario)
    out = args.out or Path("loadtests/reports") / scenario.name
    if args.write_policies:
        if not args.upstream:
            parser.error("--write-policies needs --upstream")
        write_policies(args.write_policies, scenario, dict.fromkeys(ARMS, args.upstream), args.api_key_env)
        print(f"wrote {args.write_policies} (keys in {args.write_policies / 'keys.json'})")
        return 0
    if args.gateway:
        if not (args.access and args.upstream):
            parser.error("--gateway needs --access and --upstream")
        keys = json.loads(args.access.read_text())
        summaries, answers, notes = run_arms(scenario, args.gateway, keys, dict.fromkeys(ARMS, args.upstream),
                                             False, args.restart_cmd)
        notes.append("real server: no per-request record of CPU-loaded tokens; the share comes from "
                     "vllm:kv_offload_load_bytes_total over kv_bytes_per_token x the hot returns' prompt tokens")
    else:
        with self_started(scenario, out / "stack") as (gateway, keys, upstreams):
            summaries, answers, notes = run_arms(scenario, gateway, keys, upstreams, True, None)
        notes.append("self-started: one kvgate sim per arm")
    write_report(out, scenario.workload, summaries, answers, notes, render_summary)
    print((out / "summary.md").read_text())
    return 0
