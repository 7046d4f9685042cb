"""Shadow-cost benchmark (issue 4): the gateway's own CPU per primary request at c=32 with `shadow.sample`
0, 0.1 and 1.0. Target: sampling 10 % costs at most 10 % more CPU per primary request than not shadowing.

One fast upstream (loadtests.fast_upstream) serves both the primary and the shadow pool; one gateway process
runs throughout, and the sample is changed between phases by rewriting the tenant's policy and calling
POST /admin/reload, so every phase runs in the same warmed-up process. Each round measures direct once (the
TTFT reference), then the samples in rotating order; figures are medians over rounds, and the increase is
the median of each round's paired ratio. The shadow outcomes the gateway counted in each phase are reported
too, so shadows that fail fast (and so cost little) cannot pass for cheap ones. Layout and CPU accounting are
those of loadtests.proxy_overhead (gateway on the proxy core; upstream and load generator on the bench core).

    .venv/bin/python -m loadtests.shadow_cost --out /tmp/shadow-cost.json --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import uvloop
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gateway.keys import hash_key, new_key
from loadtests import procstat
from loadtests import proxy_overhead as bench
from loadtests.loadgen import Target
from loadtests.overhead_report import DIRECT, GATEWAY, Measurement, without_nan

SAMPLES = (0.0, 0.1, 1.0)
TARGET_SAMPLE = 0.1
TARGET_INCREASE = 0.10
ADMIN = "root"
OUTCOME_FAMILY = "kvgate_shadow_requests"


@dataclass(frozen=True)
class Phase:
    sample: float | None  # None: direct to the upstream
    round: int
    cpu_ms_per_request: float
    requests_per_s: float
    ttft_p50_ms: float
    completed: int
    errors: int
    foreign_load: float
    shadow_outcomes: dict[str, float]  # what the gateway counted during the phase


@dataclass(frozen=True)
class Rig:
    """The running servers and what the phases need to reach them."""

    processes: bench.Processes
    direct: Target
    gateway: Target
    gateway_url: str
    policies: Path
    admin_key: str


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, bench.Config]:
    parser = argparse.ArgumentParser(prog="python -m loadtests.shadow_cost", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=12.0, help="measurement window per phase, s")
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args(argv)
    config = bench.parse_args(["--out", str(args.out), "--no-nginx", "--concurrency", str(args.concurrency),
                               "--duration", str(args.duration), "--warmup", str(args.warmup)])
    return args, config


# -- servers and policy -------------------------------------------------------------------------------


def write_admin(policies: Path) -> str:
    key = new_key()
    admin = {"tenant": ADMIN, "keys": [{"sha256": hash_key(key), "scopes": ["admin", "metrics"]}]}
    (policies / "tenants" / f"{ADMIN}.yaml").write_text(yaml.safe_dump(admin, sort_keys=False))
    return key


def set_sample(rig: Rig, sample: float) -> None:
    path = rig.policies / "tenants" / f"{bench.TENANT}.yaml"
    tenant = yaml.safe_load(path.read_text())
    tenant["shadow"]["sample"] = sample
    path.write_text(yaml.safe_dump(tenant, sort_keys=False))
    reply = httpx.post(f"{rig.gateway_url}/admin/reload", headers=_auth(rig.admin_key), timeout=10)
    reply.raise_for_status()


def shadow_outcomes(rig: Rig) -> dict[str, float]:
    text = httpx.get(f"{rig.gateway_url}/metrics", headers=_auth(rig.admin_key), timeout=10).text
    samples = [sample for family in text_string_to_metric_families(text) if family.name == OUTCOME_FAMILY
               for sample in family.samples if sample.name.endswith("_total")]
    return {s.labels["outcome"]: s.value for s in samples if s.labels.get("tenant") == bench.TENANT}


def _auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@contextmanager
def rig(config: bench.Config, work: Path) -> Iterator[Rig]:
    with ExitStack() as stack:
        upstream = stack.enter_context(bench.start_upstream(config, work))
        gateway_cm, key = bench.start_gateway(config, work, upstream.url)
        admin_key = write_admin(work / "policies")
        gateway = stack.enter_context(gateway_cm)
        for pid in procstat.process_tree(gateway.popen.pid):
            procstat.pin_process(pid, {config.proxy_core})
        pids = {GATEWAY: procstat.process_tree(gateway.popen.pid)}
        processes = bench.Processes(pids, upstream.popen.pid, os.getpid(), gateway.log_path)
        targets = bench.make_targets(config, {DIRECT: upstream.url, GATEWAY: gateway.url}, key)
        yield Rig(processes, targets[0], targets[1], gateway.url, work / "policies", admin_key)


# -- measuring ----------------------------------------------------------------------------------------


async def measure(config: bench.Config, rig: Rig, sample: float | None, round_index: int) -> Phase:
    target = rig.direct if sample is None else rig.gateway
    if sample is not None:
        set_sample(rig, sample)
    before = shadow_outcomes(rig)
    measured = await bench.quietest_phase(config, target, config.concurrency[0], round_index, rig.processes)
    after = shadow_outcomes(rig)
    return phase(sample, measured, {name: value - before.get(name, 0.0) for name, value in after.items()})


def phase(sample: float | None, measured: Measurement, outcomes: dict[str, float]) -> Phase:
    stats = measured.stats
    return Phase(sample, measured.round, measured.proxy_cpu_ms_per_request, stats.requests_per_s,
                 stats.ttft_p50_ms, stats.completed, stats.errors, measured.foreign_load,
                 {name: value for name, value in outcomes.items() if value})


async def measure_all(config: bench.Config, rig: Rig, rounds: int) -> list[Phase]:
    await bench.sanity_check([rig.direct, rig.gateway], bench.expected_events(config))
    phases: list[Phase] = []
    for round_index in range(rounds):
        order = SAMPLES[round_index % len(SAMPLES):] + SAMPLES[:round_index % len(SAMPLES)]
        for sample in (None, *order):
            phases.append(await measure(config, rig, sample, round_index))
            print(progress_line(phases[-1]), file=sys.stderr, flush=True)
    return phases


def progress_line(measured: Phase) -> str:
    arm = "direct" if measured.sample is None else f"sample {measured.sample:g}"
    return (f"  round {measured.round} {arm:<11} {measured.requests_per_s:7.1f} req/s  TTFT p50 "
            f"{measured.ttft_p50_ms:6.2f} ms  CPU {measured.cpu_ms_per_request:5.3f} ms/req  "
            f"shadows {measured.shadow_outcomes}")


# -- summary ------------------------------------------------------------------------------------------


def summarize(phases: list[Phase]) -> dict[str, Any]:
    by_sample = {sample: [p for p in phases if p.sample == sample] for sample in SAMPLES}
    direct_ttft = statistics.median(p.ttft_p50_ms for p in phases if p.sample is None)
    arms = {f"{sample:g}": arm_figures(runs, direct_ttft) for sample, runs in by_sample.items()}
    increase = statistics.median(paired_increases(phases, TARGET_SAMPLE))
    per_shadow = arms["1"]["cpu_ms_per_request"] - arms["0"]["cpu_ms_per_request"]
    return {
        "direct_ttft_p50_ms": direct_ttft, "by_sample": arms,
        "cpu_increase_at_0.1": increase, "cpu_increases_at_0.1_by_round": paired_increases(phases, TARGET_SAMPLE),
        "cpu_ms_per_shadow": per_shadow,
        "shadow_cost_in_primaries": per_shadow / arms["0"]["cpu_ms_per_request"],
        "target": {"name": "shadowing 10 % costs <= 10 % CPU per primary request", "limit": TARGET_INCREASE,
                   "measured": increase, "met": increase <= TARGET_INCREASE},
    }


def arm_figures(runs: list[Phase], direct_ttft: float) -> dict[str, Any]:
    outcomes: dict[str, float] = {}
    for run in runs:
        for name, value in run.shadow_outcomes.items():
            outcomes[name] = outcomes.get(name, 0.0) + value
    return {
        "cpu_ms_per_request": statistics.median(run.cpu_ms_per_request for run in runs),
        "requests_per_s": statistics.median(run.requests_per_s for run in runs),
        "ttft_p50_ms": statistics.median(run.ttft_p50_ms for run in runs),
        "added_ttft_p50_ms": statistics.median(run.ttft_p50_ms for run in runs) - direct_ttft,
        "completed": sum(run.completed for run in runs), "errors": sum(run.errors for run in runs),
        "shadow_outcomes": outcomes,
    }


def paired_increases(phases: list[Phase], sample: float) -> list[float]:
    """Per round: CPU per primary request at `sample` over that at 0, minus one."""
    rounds = sorted({p.round for p in phases})
    cpu = {(p.round, p.sample): p.cpu_ms_per_request for p in phases}
    return [cpu[r, sample] / cpu[r, 0.0] - 1 for r in rounds]


def print_summary(summary: dict[str, Any]) -> None:
    print(f"{'sample':>7} {'CPU ms/req':>11} {'req/s':>8} {'TTFT p50':>9} {'added':>7}  shadow outcomes")
    for sample, arm in summary["by_sample"].items():
        print(f"{sample:>7} {arm['cpu_ms_per_request']:11.3f} {arm['requests_per_s']:8.1f} "
              f"{arm['ttft_p50_ms']:9.2f} {arm['added_ttft_p50_ms']:+7.2f}  {arm['shadow_outcomes']}")
    target = summary["target"]
    print(f"one shadow costs {summary['cpu_ms_per_shadow']:.3f} ms of gateway CPU "
          f"({summary['shadow_cost_in_primaries']:.0%} of a primary request)")
    print(f"{'met ' if target['met'] else 'MISS'}  {target['name']}: {target['measured']:+.1%} "
          f"(rounds: {', '.join(f'{x:+.1%}' for x in summary['cpu_increases_at_0.1_by_round'])})")


def main(argv: Sequence[str] | None = None) -> int:
    args, config = parse_args(argv)
    bench.check_cores(config)
    os.sched_setaffinity(0, {config.bench_core})
    with tempfile.TemporaryDirectory(prefix="kvgate-shadow-cost-") as tmp, rig(config, Path(tmp)) as running:
        phases = uvloop.run(measure_all(config, running, args.rounds))
    summary = summarize(phases)
    print_summary(summary)
    result = {"config": {"rounds": args.rounds, "concurrency": args.concurrency, "duration_s": args.duration,
                         "warmup_s": args.warmup, "tokens": config.tokens, "ttft_ms": config.ttft_ms,
                         "token_ms": config.token_ms},
              "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                          "at": time.strftime("%Y-%m-%dT%H:%M:%S")},
              "summary": summary, "phases": [asdict(p) for p in phases]}
    args.out.write_text(json.dumps(without_nan(result), indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
