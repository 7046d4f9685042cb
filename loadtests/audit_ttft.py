"""Request TTFT while compliance tooling polls `/admin/audit` (issue 12). Not a test.

A `kvgate serve` gateway keeps its ledger in a copy of a big SQLite ledger (`--ledger`, e.g. the 10M-record
file `loadtests/ledger_scale.py --ledger PATH` builds) in front of a `kvgate sim --offload` that publishes KV
events for every request. Closed-loop streaming traffic (`loadtests/loadgen.py`) runs through the gateway in
alternating phases: without a poller, and with one asking `/admin/audit` every `--poll-s` seconds (what the
gateway does for it: flush the ledger's writer, then read the report on the ledger's reader thread). TTFT
p50/p99 of each phase, the audit's own latency, and the difference are printed and written as JSON.

    .venv/bin/python -m loadtests.audit_ttft --ledger /tmp/kvgate-ledger-10m.sqlite3 --out /tmp/audit-ttft.json

Every process it starts is stopped (by PID) when it ends. Figures from a shared machine are noisy: say so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, run_server
from gateway.keys import hash_key, new_key
from gateway.tasks import TaskSupervisor
from loadtests.loadgen import Target, percentile, run_phase, summarize

TENANTS = ("acme", "globex", "initech")


@dataclass
class Stack:
    gateway: ServerProcess
    keys: dict[str, str]
    admin_key: str


def write_policies(root: Path, sim_port: int, events_port: int) -> tuple[dict[str, str], str]:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "gateway.yaml").write_text(
        f"pools:\n  offload:\n    upstreams: [\"http://127.0.0.1:{sim_port}\"]\n"
        f"    kv_events: [\"tcp://127.0.0.1:{events_port}\"]\n"
        "default_pool: offload\npublic_paths: [\"/livez\", \"/metrics\"]\n")
    keys = {tenant: new_key() for tenant in TENANTS}
    admin = new_key()
    for tenant, key in keys.items():
        extra = f"  - sha256: \"{hash_key(admin)}\"\n    scopes: [admin]\n" if tenant == "acme" else ""
        (root / "tenants" / f"{tenant}.yaml").write_text(
            f"tenant: {tenant}\nkeys:\n  - sha256: \"{hash_key(key)}\"\n    scopes: [inference]\n{extra}"
            "cache:\n  isolation: tenant\noffload:\n  retention_seconds: 3600\n")
    return keys, admin


@contextmanager
def stack(workdir: Path, ledger: Path) -> Iterator[Stack]:
    sim_port, events_port = free_port(), free_port_pair()
    keys, admin = write_policies(workdir / "policies", sim_port, events_port)
    state = workdir / "ledger.sqlite3"
    shutil.copyfile(ledger, state)
    with ExitStack() as exits:
        exits.enter_context(run_server(
            kvgate_command("sim", "--port", str(sim_port), "--offload", "--base-ttft-ms", "20",
                           "--decode-ms-per-token", "2", "--max-tokens-default", "32",
                           "--kv-events-endpoint", f"tcp://*:{events_port}",
                           "--kv-events-replay-endpoint", f"tcp://*:{events_port + 1}"),
            sim_port, workdir / "sim.log", ready_path="/health"))
        port = free_port()
        env = {"KVGATE_SALT_SECRET": secrets.token_hex(32), "KVGATE_POLICIES": str(workdir / "policies"),
               "KVGATE_STATE_PATH": str(state), "KVGATE_LOG_FORMAT": "json", "KVGATE_LOG_LEVEL": "warning"}
        gateway = exits.enter_context(run_server(
            kvgate_command("serve", "--policies", str(workdir / "policies"), "--port", str(port)), port,
            workdir / "gateway.log", env=env, ready_path="/livez"))
        yield Stack(gateway, keys, admin)


def target(stack: Stack, tenant: str, words: int) -> Target:
    prompt = " ".join(f"{tenant}-w{index}" for index in range(words))
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 32, "stream": True}).encode()
    return Target(tenant, f"{stack.gateway.url}/v1/completions",
                  {"Authorization": f"Bearer {stack.keys[tenant]}", "Content-Type": "application/json"}, body)


@dataclass
class Phase:
    label: str
    ttft_p50_ms: float
    ttft_p99_ms: float
    requests_per_s: float
    ttft_samples: int
    errors: int
    audits: int = 0
    audit_p50_ms: float | None = None
    audit_max_ms: float | None = None
    audit_failures: int = 0


async def poll(stack: Stack, interval_s: float, stop: asyncio.Event, latencies: list[float],
               failures: list[int]) -> None:
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=30) as client:
        while not stop.is_set():
            started = time.perf_counter()
            response = await client.get("/admin/audit", headers={"Authorization": f"Bearer {stack.admin_key}"})
            if response.status_code == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failures.append(response.status_code)
            await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - started)))


async def phase(stack: Stack, args: argparse.Namespace, polled: bool, number: int) -> Phase:
    load = target(stack, TENANTS[number % len(TENANTS)], args.prompt_words)
    latencies: list[float] = []
    failures: list[int] = []
    stop = asyncio.Event()
    tasks = TaskSupervisor("audit-ttft")
    if polled:
        tasks.spawn(poll(stack, args.poll_s, stop, latencies, failures), "audit-poller")
    run = await run_phase(load, args.concurrency, args.warmup, args.duration, 1.0, lambda: None)
    stop.set()
    await tasks.drain()
    stats = summarize(run.samples, run.start.at, run.end.at)
    label = f"audit polled every {args.poll_s:.1f} s" if polled else "no poller"
    result = Phase(label, stats.ttft_p50_ms,
                   stats.ttft_p99_ms, stats.requests_per_s, stats.ttft_samples, stats.errors)
    if polled:
        ms = [1000 * value for value in latencies]
        result.audits, result.audit_failures = len(ms), len(failures)
        result.audit_p50_ms = percentile(ms, 50) if ms else None
        result.audit_max_ms = max(ms) if ms else None
    return result


async def stored_blocks(stack: Stack) -> int:
    """Blocks the ledger holds a record of (all tenants and media): it grows when KV events are ingested."""
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=120) as client:
        response = await client.get("/admin/audit", headers={"Authorization": f"Bearer {stack.admin_key}"})
        response.raise_for_status()
    return sum(view.get("stored", 0) for media in response.json()["tenants"].values() for view in media.values()
               if isinstance(view, dict))


async def run(stack: Stack, args: argparse.Namespace) -> tuple[list[Phase], dict[str, int]]:
    before = await stored_blocks(stack)
    phases = []
    for number in range(2 * args.rounds):
        phases.append(await phase(stack, args, polled=number % 2 == 1, number=number))
        print(line(phases[-1]), flush=True)
    after = await stored_blocks(stack)
    print(f"ledger records: {before:,} before the traffic, {after:,} after ({after - before:,} ingested)")
    return phases, {"stored_before": before, "stored_after": after}


def line(item: Phase) -> str:
    audit = (f"  audits {item.audits} (p50 {item.audit_p50_ms:.1f} ms, max {item.audit_max_ms:.1f} ms, "
             f"failed {item.audit_failures})" if item.audits else "")
    return (f"{item.label:26s} TTFT p50 {item.ttft_p50_ms:7.1f} ms  p99 {item.ttft_p99_ms:7.1f} ms  "
            f"{item.requests_per_s:6.1f} req/s  n {item.ttft_samples}  errors {item.errors}{audit}")


def medians(phases: list[Phase]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for label in dict.fromkeys(item.label for item in phases):
        group = [item for item in phases if item.label == label]
        out[label] = {name: _median([getattr(item, name) for item in group])
                      for name in ("ttft_p50_ms", "ttft_p99_ms", "requests_per_s")}
    return out


def _median(values: list[float]) -> float:
    ordered = sorted(value for value in values if not math.isnan(value))
    return ordered[len(ordered) // 2] if ordered else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ledger", type=Path, required=True, help="the SQLite ledger to copy for the gateway")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=20.0, help="measured window per phase, seconds")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of phases (without, with the poller)")
    parser.add_argument("--poll-s", type=float, default=1.0)
    parser.add_argument("--prompt-words", type=int, default=200)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-audit-ttft-"))
    try:
        with stack(workdir, args.ledger) as running:
            phases, ledger = asyncio.run(run(running, args))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    summary = medians(phases)
    for label, values in summary.items():
        print(f"median over rounds, {label}: {values}")
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "phases": [asdict(item) for item in phases], "medians": summary,
                                        "ledger": ledger},
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
