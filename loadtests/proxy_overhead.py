"""Proxy-overhead benchmark: kvgate against a direct connection to a fast upstream (loopback only).

Layout (see ../shared/design/proxy-costs.md): the fast upstream (loadtests.fast_upstream) and this process,
the load generator, share the bench core; one gateway worker (`kvgate serve`) runs alone on the gateway core.
For each concurrency, a direct phase and a gateway phase (order alternating) each run a warm-up, then a
fixed measurement window. Reported per concurrency: client TTFT p50/p99 direct and through the gateway, the
TTFT the gateway adds, throughput both ways and their ratio, and the gateway's CPU per request (from
/proc/<pid>/stat); plus the gateway's idle RSS. With several rounds, figures are medians over rounds.

    .venv/bin/python -m loadtests.proxy_overhead --out /tmp/proxy-overhead.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import uvloop
import yaml

from gateway.keys import hash_key, new_key
from gateway.localproc import ServerProcess, free_port, kvgate_command, run_server
from loadtests import loadgen, procstat, pyspy
from loadtests.loadgen import PhaseStats, Target

REPO_ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
IDLE_SETTLE_S = 1.0
TENANT = "bench"
PROMPT = "Explain in a few words why a per-tenant cache salt keeps prefix caches apart. " * 3
ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
PROFILE_RATE_HZ = 500
PROFILE_ROWS = 60
LOOP_FRAME = "Runner.run (asyncio/runners.py)"  # own samples here are C code under the event loop
FOREIGN_LOAD_WARNING = 0.05  # a core this much busier than our processes explain: results are noisy


@dataclass(frozen=True)
class Config:
    out: Path
    concurrency: tuple[int, ...]
    duration_s: float
    warmup_s: float
    rounds: int
    route: str
    tokens: int
    ttft_ms: float
    token_ms: float
    client_usage: bool
    gateway_core: int
    bench_core: int
    log_level: str
    profile_out: Path | None
    profile_concurrency: int
    profile_native: bool

    @property
    def stream_s(self) -> float:
        return (self.ttft_ms + self.token_ms * (self.tokens - 1)) / 1000


@dataclass(frozen=True)
class Snapshot:
    gateway_cpu_s: float
    gateway_system_s: float
    upstream_cpu_s: float
    loadgen_cpu_s: float
    core_busy_s: dict[int, float]


@dataclass(frozen=True)
class Pids:
    gateway: int
    upstream: int
    loadgen: int

    def snapshot(self) -> Snapshot:
        user, system = procstat.process_cpu_split(self.gateway)
        return Snapshot(user + system, system, procstat.process_cpu_s(self.upstream),
                        procstat.process_cpu_s(self.loadgen), procstat.core_busy_s())


@dataclass(frozen=True)
class Measurement:
    """One phase: one target at one concurrency in one round."""

    target: str
    concurrency: int
    round: int
    stats: PhaseStats
    gateway_cpu_ms_per_request: float
    gateway_system_share: float  # of the gateway's CPU time, the part spent in the kernel
    gateway_core_busy: float  # share of the window the gateway process was on CPU
    bench_processes_busy: float  # upstream + load generator CPU, as a share of the window (1.0 = one core)
    core_busy: dict[int, float]  # each core's busy share of the window, all processes
    requests_in_phase: int  # every request of the phase, warm-up and drain included


@dataclass(frozen=True)
class Outcome:
    measurements: list[Measurement]
    idle_rss: int
    rss_after: int
    profile: dict[str, Any] | None


@dataclass
class Summary:
    concurrency: int
    direct: dict[str, float] = field(default_factory=dict)
    gateway: dict[str, float] = field(default_factory=dict)
    added_ttft_p50_ms: float = math.nan
    added_ttft_p99_ms: float = math.nan
    throughput_ratio: float = math.nan


# -- set-up -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m loadtests.proxy_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window per phase, s")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each window, s")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds; figures are medians")
    parser.add_argument("--route", choices=sorted(ROUTE_PATHS), default="chat")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--no-client-usage", dest="client_usage", action="store_false",
                        help="clients do not ask for usage (the gateway then asks and strips the usage event)")
    parser.add_argument("--gateway-core", type=int, default=1)
    parser.add_argument("--bench-core", type=int, default=0, help="core of the upstream and load generator")
    parser.add_argument("--log-level", default="info", help="the gateway's KVGATE_LOG_LEVEL")
    parser.add_argument("--profile-out", type=Path, help="also record the gateway with py-spy (collapsed stacks)")
    parser.add_argument("--profile-concurrency", type=int, default=256)
    parser.add_argument("--profile-native", action="store_true", help="py-spy --native (C frames too)")
    args = parser.parse_args(argv)
    return Config(
        out=args.out, concurrency=tuple(args.concurrency), duration_s=args.duration, warmup_s=args.warmup,
        rounds=args.rounds, route=args.route, tokens=args.tokens, ttft_ms=args.ttft_ms, token_ms=args.token_ms,
        client_usage=args.client_usage, gateway_core=args.gateway_core, bench_core=args.bench_core,
        log_level=args.log_level, profile_out=args.profile_out, profile_concurrency=args.profile_concurrency,
        profile_native=args.profile_native,
    )


def check_cores(config: Config) -> None:
    available = procstat.process_affinity(0)
    wanted = {config.gateway_core, config.bench_core}
    if len(wanted) != 2 or not wanted <= available:
        raise SystemExit(f"need two distinct cores out of {sorted(available)}, got {sorted(wanted)}")


def write_policies(root: Path, upstream_url: str) -> str:
    """A one-pool, one-tenant policy directory; returns the tenant's fresh key (never printed)."""
    key = new_key()
    gateway = {"pools": {"bench": {"upstreams": [upstream_url]}}, "default_pool": "bench",
               "public_paths": ["/livez"]}
    tenant = {"tenant": TENANT, "keys": [{"sha256": hash_key(key), "scopes": ["inference"]}],
              "cache": {"isolation": "tenant"}, "rollout": {"pool": "bench", "percent": 100}}
    (root / "tenants").mkdir(parents=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    (root / "tenants" / f"{TENANT}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return key


def request_body(config: Config) -> bytes:
    body: dict[str, Any] = {"model": "m", "max_tokens": config.tokens, "stream": True}
    if config.route == "chat":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if config.client_usage:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def targets(config: Config, upstream: str, gateway: str, key: str) -> tuple[Target, Target]:
    path = ROUTE_PATHS[config.route]
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    body = request_body(config)
    return Target("direct", upstream + path, headers, body), Target("gateway", gateway + path, headers, body)


def expected_events(config: Config) -> int:
    return config.tokens + (config.route == "chat") + config.client_usage + 1


def importable_here() -> dict[str, str]:
    """Environment for a child that imports `loadtests` whatever its working directory."""
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


@contextmanager
def servers(config: Config, work: Path) -> Iterator[tuple[ServerProcess, ServerProcess, str]]:
    """The fast upstream (bench core) and one gateway worker (gateway core); stopped by PID on exit."""
    upstream_port, gateway_port = free_port(), free_port()
    upstream_argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(upstream_port),
                     "--ttft-ms", str(config.ttft_ms), "--token-ms", str(config.token_ms),
                     "--tokens", str(config.tokens)]
    with ExitStack() as stack:
        upstream = stack.enter_context(run_server(upstream_argv, upstream_port, work / "upstream.log",
                                                  env=importable_here(), ready_path="/health"))
        key = write_policies(work / "policies", upstream.url)
        gateway_env = {"KVGATE_SALT_SECRET": "bench-" + secrets.token_hex(16), "KVGATE_LOG_LEVEL": config.log_level}
        gateway_argv = kvgate_command("serve", "--policies", str(work / "policies"), "--port", str(gateway_port))
        gateway = stack.enter_context(run_server(gateway_argv, gateway_port, work / "gateway.log", env=gateway_env))
        procstat.pin_process(gateway.popen.pid, {config.gateway_core})
        yield upstream, gateway, key


# -- measuring ----------------------------------------------------------------------------------------


async def sanity_check(pair: tuple[Target, Target], expected: int) -> None:
    async with loadgen.new_session(1) as session:
        for target in pair:
            sample = await loadgen.one_request(session, target)
            if not sample.ok or sample.events != expected:
                raise RuntimeError(f"{target.name}: ok={sample.ok}, {sample.events} events (expected {expected})")


async def measure_phase(
    config: Config, target: Target, concurrency: int, round_index: int, snapshot: Callable[[], Snapshot]
) -> Measurement:
    run = await loadgen.run_phase(target, concurrency, config.warmup_s, config.duration_s, config.stream_s,
                                  snapshot)
    stats = loadgen.summarize(run.samples, run.start.at, run.end.at)
    before, after = run.start.value, run.end.value
    window = run.end.at - run.start.at
    gateway_cpu = after.gateway_cpu_s - before.gateway_cpu_s
    gateway_system = after.gateway_system_s - before.gateway_system_s
    bench_cpu = (after.upstream_cpu_s - before.upstream_cpu_s) + (after.loadgen_cpu_s - before.loadgen_cpu_s)
    cores = {core: (after.core_busy_s[core] - busy) / window for core, busy in before.core_busy_s.items()}
    return Measurement(
        target=target.name, concurrency=concurrency, round=round_index, stats=stats,
        gateway_cpu_ms_per_request=gateway_cpu * 1000 / stats.completed if stats.completed else math.nan,
        gateway_system_share=gateway_system / gateway_cpu if gateway_cpu else math.nan,
        gateway_core_busy=gateway_cpu / window, bench_processes_busy=bench_cpu / window, core_busy=cores,
        requests_in_phase=len(run.samples),
    )


async def measure_all(config: Config, pair: tuple[Target, Target], pids: Pids) -> list[Measurement]:
    await sanity_check(pair, expected_events(config))
    measurements: list[Measurement] = []
    for round_index in range(config.rounds):
        for position, concurrency in enumerate(config.concurrency):
            order = pair if (round_index + position) % 2 == 0 else pair[::-1]
            for target in order:
                measured = await measure_phase(config, target, concurrency, round_index, pids.snapshot)
                print(progress_line(measured), file=sys.stderr, flush=True)
                measurements.append(measured)
    return measurements


async def profile_phase(config: Config, gateway: Target, pids: Pids, output: Path) -> Measurement:
    with pyspy.recording(pids.gateway, output, rate_hz=PROFILE_RATE_HZ, native=config.profile_native):
        return await measure_phase(config, gateway, config.profile_concurrency, -1, pids.snapshot)


def progress_line(measured: Measurement) -> str:
    stats = measured.stats
    return (f"  round {measured.round} c={measured.concurrency:<4} {measured.target:<8} "
            f"{stats.requests_per_s:8.1f} req/s  TTFT p50 {stats.ttft_p50_ms:7.2f} ms  p99 {stats.ttft_p99_ms:7.2f} ms"
            f"  errors {stats.errors}  gateway CPU {measured.gateway_core_busy:5.1%}")


# -- summarising --------------------------------------------------------------------------------------


def phase_figures(measured: Measurement) -> dict[str, float]:
    stats = measured.stats
    return {
        "ttft_p50_ms": stats.ttft_p50_ms, "ttft_p99_ms": stats.ttft_p99_ms, "requests_per_s": stats.requests_per_s,
        "completed": stats.completed, "errors": stats.errors, "events_per_request": stats.events_per_request,
        "gateway_cpu_ms_per_request": measured.gateway_cpu_ms_per_request,
        "gateway_system_share": measured.gateway_system_share,
        "gateway_core_busy": measured.gateway_core_busy, "bench_processes_busy": measured.bench_processes_busy,
    }


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(row[name] for row in rows) for name in rows[0]} if rows else {}


def summarize(measurements: list[Measurement], concurrency: int) -> Summary:
    summary = Summary(concurrency)
    here = [measured for measured in measurements if measured.concurrency == concurrency]
    summary.direct = medians([phase_figures(m) for m in here if m.target == "direct"])
    summary.gateway = medians([phase_figures(m) for m in here if m.target == "gateway"])
    if summary.direct and summary.gateway:
        summary.added_ttft_p50_ms = summary.gateway["ttft_p50_ms"] - summary.direct["ttft_p50_ms"]
        summary.added_ttft_p99_ms = summary.gateway["ttft_p99_ms"] - summary.direct["ttft_p99_ms"]
        summary.throughput_ratio = summary.gateway["requests_per_s"] / summary.direct["requests_per_s"]
    return summary


def target_checks(summaries: list[Summary]) -> dict[str, dict[str, Any]]:
    """This slice's targets, and the nginx-parity bar of proxy-costs.md, where the concurrency was run."""
    by_c = {summary.concurrency: summary for summary in summaries}
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, concurrency: int, value: Callable[[Summary], float], limit: float, upper: bool) -> None:
        if concurrency in by_c:
            measured = value(by_c[concurrency])
            checks[name] = {"measured": measured, "limit": limit,
                            "met": measured <= limit if upper else measured >= limit}

    check("slice: added TTFT p50 at c=32 <= 1 ms", 32, lambda s: s.added_ttft_p50_ms, 1.0, upper=True)
    check("slice: throughput at c=256 >= 0.8x direct", 256, lambda s: s.throughput_ratio, 0.8, upper=False)
    check("bar: added TTFT p50 at c=32 <= 0.3 ms", 32, lambda s: s.added_ttft_p50_ms, 0.3, upper=True)
    check("bar: added TTFT p50 at c=256 <= 2 ms", 256, lambda s: s.added_ttft_p50_ms, 2.0, upper=True)
    check("bar: throughput at c=256 >= 0.93x direct", 256, lambda s: s.throughput_ratio, 0.93, upper=False)
    return checks


def noise_warnings(measurements: list[Measurement], config: Config) -> list[str]:
    """Phases where a core was busier than our own processes explain (another workload on the machine)."""
    warnings = []
    for measured in measurements:
        ours = {config.gateway_core: measured.gateway_core_busy, config.bench_core: measured.bench_processes_busy}
        for core, own in ours.items():
            foreign = measured.core_busy[core] - own
            if foreign > FOREIGN_LOAD_WARNING:
                warnings.append(f"round {measured.round} c={measured.concurrency} {measured.target}: core {core} "
                                f"{foreign:.0%} busier than the benchmark's own processes")
    return warnings


def table(summaries: list[Summary]) -> str:
    header = ("   c | TTFT p50 direct / gw (ms) | TTFT p99 direct / gw (ms) | added p50 | added p99 "
              "| req/s direct / gw | ratio | gw CPU/req (sys) | gw core")
    lines = [header, "-" * len(header)]
    for s in summaries:
        d, g = s.direct, s.gateway
        lines.append(
            f"{s.concurrency:>4} | {d['ttft_p50_ms']:>11.2f} / {g['ttft_p50_ms']:>9.2f} "
            f"| {d['ttft_p99_ms']:>11.2f} / {g['ttft_p99_ms']:>9.2f} "
            f"| {s.added_ttft_p50_ms:>+6.2f} ms | {s.added_ttft_p99_ms:>+6.2f} ms "
            f"| {d['requests_per_s']:>7.1f} / {g['requests_per_s']:>7.1f} | {s.throughput_ratio:>5.2f} "
            f"| {g['gateway_cpu_ms_per_request']:>6.3f} ms ({g['gateway_system_share']:>3.0%}) "
            f"| {g['gateway_core_busy']:>6.1%}"
        )
    return "\n".join(lines)


def report(config: Config, outcome: Outcome, summaries: list[Summary]) -> dict[str, Any]:
    measurements = outcome.measurements
    return {
        "config": {**asdict(config), "out": str(config.out),
                   "profile_out": str(config.profile_out) if config.profile_out else None},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "at": time.strftime("%Y-%m-%dT%H:%M:%S")},
        "expected_events_per_request": expected_events(config),
        "gateway_idle_rss_mib": outcome.idle_rss / MIB,
        "gateway_rss_after_mib": outcome.rss_after / MIB,
        "summary": [asdict(summary) for summary in summaries],
        "targets": target_checks(summaries),
        "noise_warnings": noise_warnings(measurements, config),
        "phases": [asdict(measured) for measured in measurements],
        "profile": outcome.profile,
    }


def print_report(result: dict[str, Any], summaries: list[Summary]) -> None:
    print(table(summaries))
    print(f"gateway RSS: idle {result['gateway_idle_rss_mib']:.1f} MiB, after the run "
          f"{result['gateway_rss_after_mib']:.1f} MiB")
    for name, check in result["targets"].items():
        print(f"{'met ' if check['met'] else 'MISS'}  {name}: {check['measured']:.3f}")
    for warning in result["noise_warnings"]:
        print(f"warning: {warning}")
    profile = result["profile"]
    if profile is not None:
        print(f"py-spy profile of the gateway at c={profile['concurrency']} ({profile['path']}), "
              f"{profile['cpu_ms_per_request'] * 1000:.0f} µs CPU per request, of which Python frames sampled "
              f"{profile['python_us_per_request']:.0f} µs; functions by own time, µs per request (own / inclusive); "
              f"'{LOOP_FRAME}' own = idle + C under the event loop:")
        for row in profile["functions"][:25]:
            print(f"  {row['own_us']:7.1f} / {row['inclusive_us']:7.1f}  {row['function']}")


def profile_summary(path: Path, measured: Measurement) -> dict[str, Any]:
    """py-spy samples as µs per request (every request of the phase). py-spy's sampling in non-blocking mode
    cannot tell idle from C work under the event loop: both land on the loop frame, which is left out of
    `python_us_per_request`. On a busy machine a preempted process is sampled too (see noise_warnings)."""
    stacks = pyspy.read_collapsed(path)
    us_per_sample = 1e6 / PROFILE_RATE_HZ / max(1, measured.requests_in_phase)
    functions = pyspy.by_function(stacks)
    loop_own = sum(row.own for row in functions if row.function == LOOP_FRAME)
    return {
        "path": str(path), "concurrency": measured.concurrency, "rate_hz": PROFILE_RATE_HZ,
        "samples": sum(count for _, count in stacks), "phase": phase_figures(measured),
        "cpu_ms_per_request": measured.gateway_cpu_ms_per_request,
        "python_us_per_request": (sum(row.own for row in functions) - loop_own) * us_per_sample,
        "functions": [{"function": row.function, "own_us": row.own * us_per_sample,
                       "inclusive_us": row.inclusive * us_per_sample} for row in functions[:PROFILE_ROWS]],
    }


# -- main ---------------------------------------------------------------------------------------------


def run(config: Config) -> Outcome:
    check_cores(config)
    os.sched_setaffinity(0, {config.bench_core})  # children (the upstream) inherit the bench core
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as tmp, servers(config, Path(tmp)) as running:
        upstream, gateway, key = running
        pids = Pids(gateway.popen.pid, upstream.popen.pid, os.getpid())
        time.sleep(IDLE_SETTLE_S)  # let start-up allocations settle before reading idle RSS
        idle_rss = procstat.rss_bytes(pids.gateway)
        pair = targets(config, upstream.url, gateway.url, key)
        try:
            measurements = uvloop.run(measure_all(config, pair, pids))
            profile = None
            if config.profile_out is not None:
                profiled = uvloop.run(profile_phase(config, pair[1], pids, config.profile_out))
                profile = profile_summary(config.profile_out, profiled)
        except Exception:
            print(f"gateway log tail:\n{gateway.log_text()[-3000:]}", file=sys.stderr)
            raise
        return Outcome(measurements, idle_rss, procstat.rss_bytes(pids.gateway), profile)


def without_nan(value: Any) -> Any:
    """JSON has no NaN: figures that could not be measured become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nan(item) for item in value]
    return value


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    outcome = run(config)
    summaries = [summarize(outcome.measurements, concurrency) for concurrency in config.concurrency]
    result = report(config, outcome, summaries)
    print_report(result, summaries)
    config.out.write_text(json.dumps(without_nan(result), indent=2, default=str) + "\n")
    print(f"wrote {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
