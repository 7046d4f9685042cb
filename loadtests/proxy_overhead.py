"""Proxy-overhead benchmark: kvgate, nginx and the Rust vLLM Router (each where installed) against a direct
connection to a fast upstream, in one run.

Layout (as for the reference figures in docs/proxy-costs.md): the fast upstream (loadtests.fast_upstream) runs on
the upstream cores and this process, the load generator, on the client cores (by default both on the bench core);
one gateway worker (`kvgate serve`), nginx with one worker and vllm-router run on the proxy core, one at a time
busy (with `--granian`, also kvgate's app under granian instead of uvicorn: loadtests/granian_candidate.py;
with `--floors`, two bare relays that bound what any relay on this stack can cost: loadtests/floor_relay.py).
Loopback only. For each concurrency, a phase per target (direct, gateway, nginx;
order rotating) runs a warm-up, then a fixed measurement window. Reported per concurrency and target: client TTFT
p50/p99, the TTFT added against direct, throughput and its ratio to direct, and the proxy's CPU per request
(/proc/<pid>/stat); plus each proxy's idle RSS. With several rounds, figures are medians.

    .venv/bin/python -m loadtests.proxy_overhead --out /tmp/proxy-overhead.json
    .venv/bin/python -m loadtests.proxy_overhead --proxy-core 2 --upstream-cores 4-7 --client-cores 8-15 --out DIR
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import secrets
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import uvloop
import yaml

from gateway.devtools.localproc import ServerProcess, free_port, kvgate_command, run_server
from gateway.keys import hash_key, new_key
from loadtests import granian_candidate, loadgen, procstat, pyspy
from loadtests.loadgen import Target
from loadtests.nginx_baseline import nginx_binary, run_nginx
from loadtests.overhead_report import (
    DIRECT,
    FOREIGN_LOAD_WARNING,
    GATEWAY,
    Measurement,
    Summary,
    idle_rss_check,
    print_report,
    profile_summary,
    summarize,
    target_checks,
    without_nan,
)
from loadtests.overhead_report import noise_warnings as find_noise
from loadtests.router_baseline import router_binary, run_router

REPO_ROOT = Path(__file__).resolve().parent.parent
NGINX = "nginx"
ROUTER = "router"  # the Rust vllm-router
GRANIAN = "granian"  # kvgate's app under granian instead of uvicorn (a measured candidate)
FLOOR_KINDS = {"floor-asgi": "asgi", "floor-protocol": "protocol"}  # bare relays (loadtests/floor_relay.py)
COMPARED = "gateway-compared"  # `kvgate serve` from another source tree (--compare-tree), in the same run
MIB = 1024 * 1024
IDLE_SETTLE_S = 1.0
QUIET_PROBE_S = 1.0
PROFILE_RATE_HZ = 500
TENANT = "bench"
PROMPT = "Explain in a few words why a per-tenant cache salt keeps prefix caches apart. " * 3
# The tenant's offload features, on in every benchmark that serves this tenant (issue 15: every feature stays on):
# offload admission decides each generation request before it is sent (docs/admission.md), and the miss path
# holds each stream back until its first content. `--compare-offload '{}'` measures what they cost.
OFFLOAD_FEATURES: Mapping[str, str] = MappingProxyType({"admission": "returning", "miss_path": "retry"})
COMPARED_POLICIES = "policies-compared"  # the compared gateway's policies under --compare-offload
ROUTE_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


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
    proxy_core: int
    bench_core: int
    upstream_cores: frozenset[int]
    client_cores: frozenset[int]
    nginx: bool
    router: bool
    router_binary: str | None
    granian: bool
    floors: bool
    compare_tree: Path | None
    compare_env: tuple[tuple[str, str], ...]
    compare_offload: dict[str, Any] | None  # the compared gateway's tenant's `offload` section, when given
    noisy_retries: int
    quiet_wait_s: float
    log_level: str
    profile_out: Path | None
    profile_concurrency: int
    profile_native: bool
    profile_target: str
    shadow_sample: float

    @property
    def stream_s(self) -> float:
        return (self.ttft_ms + self.token_ms * (self.tokens - 1)) / 1000


@dataclass(frozen=True)
class Snapshot:
    proxies: dict[str, tuple[float, float]]  # proxy → (CPU seconds, of which system), its whole process tree
    bench_cpu_s: float  # upstream + load generator
    core_busy_s: dict[int, float]
    gateway_log_bytes: int  # size of the gateway's log: its request lines in a window lie between two sizes

    def group_busy_s(self, cores: frozenset[int]) -> float:
        return sum(self.core_busy_s.get(core, 0.0) for core in cores)


@dataclass(frozen=True)
class Processes:
    """PIDs whose CPU the benchmark reads: each proxy's process tree, the upstream, and this process."""

    proxies: dict[str, list[int]]
    upstream: int
    loadgen: int
    gateway_log: Path

    def snapshot(self) -> Snapshot:
        proxies = {name: _tree_cpu(pids) for name, pids in self.proxies.items()}
        bench = procstat.process_cpu_s(self.upstream) + procstat.process_cpu_s(self.loadgen)
        return Snapshot(proxies, bench, procstat.core_busy_s(), self.gateway_log.stat().st_size)

    def rss_mib(self) -> dict[str, float]:
        return {name: sum(procstat.rss_bytes(pid) for pid in pids) / MIB for name, pids in self.proxies.items()}


@dataclass(frozen=True)
class Outcome:
    measurements: list[Measurement]
    idle_rss_mib: dict[str, float]
    rss_after_mib: dict[str, float]
    profile: dict[str, Any] | None


def _tree_cpu(pids: list[int]) -> tuple[float, float]:
    splits = [procstat.process_cpu_split(pid) for pid in pids]
    return sum(user + system for user, system in splits), sum(system for _, system in splits)


# -- set-up -------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m loadtests.proxy_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 256])
    parser.add_argument("--duration", type=float, default=10.0, help="measurement window per phase, s")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up before each window, s")
    parser.add_argument("--rounds", type=int, default=1, help="rounds in rotating order; figures are medians")
    parser.add_argument("--route", choices=sorted(ROUTE_PATHS), default="chat")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--no-client-usage", dest="client_usage", action="store_false",
                        help="clients do not ask for usage (the gateway then asks and strips the usage event)")
    parser.add_argument("--proxy-core", type=int, default=1, help="core of the gateway (and nginx, vllm-router)")
    parser.add_argument("--bench-core", type=int, default=0, help="core of the upstream and load generator")
    parser.add_argument("--upstream-cores", type=core_set, help="cores of the fast upstream, e.g. 4-7 (default: "
                        "the bench core)")
    parser.add_argument("--client-cores", type=core_set, help="cores of the load generator, e.g. 8-15 (default: "
                        "the bench core)")
    parser.add_argument("--no-nginx", dest="nginx", action="store_false", help="skip the nginx reference")
    parser.add_argument("--no-router", dest="router", action="store_false", help="skip the vllm-router reference")
    parser.add_argument("--router-binary", help="the vllm-router executable (default: .venv-bench/bin, then PATH)")
    parser.add_argument("--granian", action="store_true",
                        help="also measure kvgate's app served by granian instead of uvicorn "
                        "(pip install -e '.[compare]')")
    parser.add_argument("--floors", action="store_true",
                        help="also measure the two bare relays that set the floor under kvgate's stack "
                        "(loadtests/floor_relay.py: uvicorn with kvgate's upstream client; callbacks only)")
    parser.add_argument("--compare-tree", type=Path,
                        help="also measure `kvgate serve` from this source tree (its gateway/ package, e.g. "
                        "`git archive <commit> gateway | tar -x -C DIR`) with the same policies and settings, as "
                        f"target {COMPARED}: a change measured before and after inside one run")
    parser.add_argument("--compare-env", type=env_setting, action="append", default=[], metavar="NAME=VALUE",
                        help=f"also measure a second `kvgate serve` ({COMPARED}; from --compare-tree, else from "
                        "this tree) with this setting added to its environment (repeatable), e.g. "
                        "KVGATE_REUSE_TRACE=false: what one feature costs, inside one run")
    parser.add_argument("--compare-offload", type=offload_section, metavar="JSON",
                        help=f"also measure a second `kvgate serve` ({COMPARED}) whose tenant has this `offload` "
                        "section instead, e.g. '{}' (no admission, no miss path) or '{\"admission\": \"returning\"}': "
                        "what the features left out cost, inside one run")
    parser.add_argument("--noisy-retries", type=int, default=2,
                        help="run a phase again, at most this often, while another workload shares the cores")
    parser.add_argument("--quiet-wait", type=float, default=30.0,
                        help="before each phase, wait at most this long (s) for the cores to be free of other work")
    parser.add_argument("--log-level", default="info", help="the gateway's KVGATE_LOG_LEVEL")
    parser.add_argument("--profile-out", type=Path, help="also record the gateway with py-spy (collapsed stacks)")
    parser.add_argument("--profile-concurrency", type=int, default=256)
    parser.add_argument("--profile-native", action="store_true", help="py-spy --native (C frames; pauses)")
    parser.add_argument("--profile-target", default=GATEWAY,
                        help="the proxy to record (gateway, or with --floors floor-asgi / floor-protocol)")
    parser.add_argument("--shadow-sample", type=float, default=0.0,
                        help="mirror this share of requests to a shadow pool (the same fast upstream)")
    args = parser.parse_args(argv)
    return Config(
        out=args.out, concurrency=tuple(args.concurrency), duration_s=args.duration, warmup_s=args.warmup,
        rounds=args.rounds, route=args.route, tokens=args.tokens, ttft_ms=args.ttft_ms, token_ms=args.token_ms,
        client_usage=args.client_usage, proxy_core=args.proxy_core, bench_core=args.bench_core,
        upstream_cores=args.upstream_cores or frozenset({args.bench_core}),
        client_cores=args.client_cores or frozenset({args.bench_core}), nginx=args.nginx, router=args.router,
        router_binary=args.router_binary, granian=args.granian, floors=args.floors,
        compare_tree=args.compare_tree,
        compare_env=tuple(args.compare_env), compare_offload=args.compare_offload,
        noisy_retries=args.noisy_retries, quiet_wait_s=args.quiet_wait, log_level=args.log_level,
        profile_out=args.profile_out, profile_concurrency=args.profile_concurrency,
        profile_native=args.profile_native, profile_target=args.profile_target, shadow_sample=args.shadow_sample,
    )


def offload_section(text: str) -> dict[str, Any]:
    try:
        section = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(section, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return section


def env_setting(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def core_set(text: str) -> frozenset[int]:
    """`4-7`, `8,9,10` or `3`: a set of CPU numbers."""
    cores: set[int] = set()
    for part in text.split(","):
        first, _, last = part.partition("-")
        cores.update(range(int(first), int(last or first) + 1))
    return frozenset(cores)


def bench_cores(config: Config) -> frozenset[int]:
    return config.upstream_cores | config.client_cores


def check_cores(config: Config) -> None:
    available = procstat.process_affinity(0)
    wanted = bench_cores(config) | {config.proxy_core, config.bench_core}
    if config.proxy_core in bench_cores(config) or config.proxy_core == config.bench_core or not wanted <= available:
        raise SystemExit(f"need a proxy core apart from the bench cores, all out of {sorted(available)}; got proxy "
                         f"{config.proxy_core}, bench {sorted(bench_cores(config))}")


def write_policies(root: Path, upstream_url: str, shadow_sample: float,
                   offload: Mapping[str, Any] = OFFLOAD_FEATURES, key: str | None = None) -> str:
    """A one-tenant policy directory (plus a shadow pool on the same upstream) with these offload features; returns
    the tenant's key (a fresh one unless given)."""
    key = key or new_key()
    pools = {"bench": {"upstreams": [upstream_url]}, "shadow": {"upstreams": [upstream_url]}}
    gateway = {"pools": pools, "default_pool": "bench", "public_paths": ["/livez"]}
    tenant = {"tenant": TENANT, "keys": [{"sha256": hash_key(key), "scopes": ["inference"]}],
              "cache": {"isolation": "tenant"}, "rollout": {"pool": "bench", "percent": 100},
              "shadow": {"pool": "shadow", "sample": shadow_sample, "max_in_flight": 256},
              "offload": dict(offload)}
    (root / "tenants").mkdir(parents=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    (root / "tenants" / f"{TENANT}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return key


def request_body(config: Config) -> bytes:
    body: dict[str, Any] = {"model": "m", "max_tokens": config.tokens, "stream": True, "temperature": 0}
    if config.route == "chat":
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    if config.client_usage:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


def make_targets(config: Config, urls: dict[str, str], key: str) -> list[Target]:
    """The same request, sent to each base URL (direct first)."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    path, body = ROUTE_PATHS[config.route], request_body(config)
    return [Target(name, url + path, headers, body) for name, url in urls.items()]


def expected_events(config: Config) -> int:
    return config.tokens + (config.route == "chat") + config.client_usage + 1


def importable_here() -> dict[str, str]:
    """Environment for a child that imports `loadtests` whatever its working directory."""
    return importable_from(REPO_ROOT)


def importable_from(tree: Path) -> dict[str, str]:
    """Environment for a child that imports from `tree` first, then from this process's PYTHONPATH."""
    paths = [str(tree), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def start_upstream(config: Config, work: Path) -> AbstractContextManager[ServerProcess]:
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(port), "--ttft-ms", str(config.ttft_ms),
            "--token-ms", str(config.token_ms), "--tokens", str(config.tokens)]
    return run_server(argv, port, work / "upstream.log", env=importable_here(), ready_path="/health")


def start_gateway(
    config: Config, work: Path, upstream_url: str
) -> tuple[AbstractContextManager[ServerProcess], str]:
    key = write_policies(work / "policies", upstream_url, config.shadow_sample)
    if config.compare_offload is not None:
        write_policies(work / COMPARED_POLICIES, upstream_url, config.shadow_sample, config.compare_offload, key)
    port = free_port()
    argv = kvgate_command("serve", "--policies", str(work / "policies"), "--port", str(port))
    return run_server(argv, port, work / "gateway.log", env=gateway_env(config.log_level, work, GATEWAY)), key


def gateway_env(log_level: str, work: Path, name: str) -> dict[str, str]:
    # Its own state file in the run's folder: a file left in the working directory would carry one run's
    # stores (reuse trace, shadow pairs) into the next; each served gateway has its own.
    return {"KVGATE_SALT_SECRET": "bench-" + secrets.token_hex(16), "KVGATE_LOG_LEVEL": log_level,
            "KVGATE_STATE_PATH": str(work / f"{name}-state.sqlite3"), "KVGATE_POLICIES": str(work / "policies")}


def start_compared(config: Config, work: Path) -> AbstractContextManager[ServerProcess]:
    """A second `kvgate serve` on the gateway's policies: imported from `--compare-tree` (python -P: not from the
    working directory) or from this tree, with `--compare-env` added to its environment."""
    port = free_port()
    policies = work / (COMPARED_POLICIES if config.compare_offload is not None else "policies")
    argv = [sys.executable, "-P", "-m", "gateway", "serve", "--policies", str(policies), "--port", str(port)]
    env = {**gateway_env(config.log_level, work, COMPARED), "KVGATE_POLICIES": str(policies),
           **importable_from(config.compare_tree or REPO_ROOT), **dict(config.compare_env)}
    return run_server(argv, port, work / f"{COMPARED}.log", env=env)


def start_granian(config: Config, work: Path) -> AbstractContextManager[ServerProcess]:
    """The same app, policies and settings as the uvicorn gateway (its policy folder), served by granian."""
    port = free_port()
    env = {**gateway_env(config.log_level, work, GRANIAN), **importable_here()}
    return run_server(granian_candidate.granian_argv(port), port, work / "granian.log", env=env)


def start_floor(kind: str, work: Path, upstream_url: str) -> AbstractContextManager[ServerProcess]:
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.floor_relay", kind, "--port", str(port), "--upstream", upstream_url]
    return run_server(argv, port, work / f"floor-{kind}.log", env=importable_here(), ready_path="/health")


@contextmanager
def servers(config: Config, work: Path) -> Iterator[tuple[ServerProcess, dict[str, ServerProcess], str]]:
    """The fast upstream (bench core) and the proxies (proxy core); all stopped by PID on exit."""
    with ExitStack() as stack:
        upstream = stack.enter_context(start_upstream(config, work))
        gateway_cm, key = start_gateway(config, work, upstream.url)
        proxies = {GATEWAY: stack.enter_context(gateway_cm)}
        binary = nginx_binary() if config.nginx else None
        if binary is not None:
            proxies[NGINX] = stack.enter_context(run_nginx(binary, work / "nginx", upstream.url))
        elif config.nginx:
            print("note: no nginx binary on PATH: the nginx reference is skipped", file=sys.stderr)
        if config.floors:
            for name, kind in FLOOR_KINDS.items():
                proxies[name] = stack.enter_context(start_floor(kind, work, upstream.url))
        if config.compare_tree is not None or config.compare_env or config.compare_offload is not None:
            proxies[COMPARED] = stack.enter_context(start_compared(config, work))
        if config.granian and granian_candidate.available():
            proxies[GRANIAN] = stack.enter_context(start_granian(config, work))
        elif config.granian:
            print("note: granian is not installed (pip install -e '.[compare]'): its phase is skipped", file=sys.stderr)
        router = router_binary(config.router_binary) if config.router else None
        if router is not None:
            proxies[ROUTER] = stack.enter_context(run_router(router, work / "router", upstream.url))
        elif config.router:
            print("note: no vllm-router (python3 -m venv .venv-bench && .venv-bench/bin/pip install "
                  "vllm-router==0.1.17): the vllm-router reference is skipped", file=sys.stderr)
        for proxy in proxies.values():
            for pid in procstat.process_tree(proxy.popen.pid):
                procstat.pin_process(pid, {config.proxy_core})
        for pid in procstat.process_tree(upstream.popen.pid):
            procstat.pin_process(pid, config.upstream_cores)
        yield upstream, proxies, key


# -- measuring ----------------------------------------------------------------------------------------


async def sanity_check(targets: Sequence[Target], expected: int) -> None:
    async with loadgen.new_session(1) as session:
        for target in targets:
            sample = await loadgen.one_request(session, target)
            if not sample.ok or sample.events != expected:
                raise RuntimeError(f"{target.name}: ok={sample.ok}, {sample.events} events (expected {expected})")


async def measure_phase(
    config: Config, target: Target, concurrency: int, round_index: int, processes: Processes
) -> Measurement:
    run = await loadgen.run_phase(target, concurrency, config.warmup_s, config.duration_s, config.stream_s,
                                  processes.snapshot)
    stats = loadgen.summarize(run.samples, run.start.at, run.end.at)
    before, after = run.start.value, run.end.value
    window = run.end.at - run.start.at
    used = {name: (after.proxies[name][0] - cpu, after.proxies[name][1] - system)
            for name, (cpu, system) in before.proxies.items()}
    proxy_cpu, proxy_system = used.get(target.name, (math.nan, math.nan))
    groups = core_groups(config)
    cores = {name: (after.group_busy_s(group) - before.group_busy_s(group)) / window for name, group in groups.items()}
    own = dict(zip(groups, (sum(cpu for cpu, _ in used.values()) / window,
                            (after.bench_cpu_s - before.bench_cpu_s) / window), strict=True))
    inside = gateway_side(processes.gateway_log, before.gateway_log_bytes, after.gateway_log_bytes)
    return Measurement(
        target=target.name, concurrency=concurrency, round=round_index, stats=stats,
        gateway_side=inside if target.name == GATEWAY else {},
        proxy_cpu_ms_per_request=proxy_cpu * 1000 / stats.completed if stats.completed else math.nan,
        proxy_system_share=proxy_system / proxy_cpu if proxy_cpu else math.nan,
        proxy_core_busy=proxy_cpu / window, bench_processes_busy=own[BENCH_GROUP], core_busy=cores,
        foreign_busy={core: cores[core] - busy for core, busy in own.items()}, requests_in_phase=len(run.samples),
    )


def gateway_side(log: Path, start: int, end: int) -> dict[str, float]:
    """The gateway's own view of the requests it finished in a window, from its request log lines: TTFT from
    arrival to relaying the first content event, and its overhead before upstream (p50/p99, ms)."""
    with log.open("rb") as file:
        file.seek(start)
        lines = file.read(end - start).splitlines()
    records = [json.loads(line) for line in lines if line.startswith(b"{") and b'"event":"request"' in line]
    figures: dict[str, float] = {}
    for field in ("ttft_ms", "overhead_ms"):
        values = [record[field] for record in records if isinstance(record.get(field), int | float)]
        figures[f"{field[:-3]}_p50_ms"] = loadgen.percentile(values, 50)
        figures[f"{field[:-3]}_p99_ms"] = loadgen.percentile(values, 99)
    return figures


async def wait_for_quiet(config: Config, processes: Processes) -> None:
    """Wait (at most `quiet_wait_s`) for a second in which no other workload kept either core busy."""
    deadline = time.monotonic() + config.quiet_wait_s
    while time.monotonic() < deadline:
        before, started = processes.snapshot(), time.monotonic()
        await asyncio.sleep(QUIET_PROBE_S)
        after, elapsed = processes.snapshot(), time.monotonic() - started
        groups = core_groups(config)
        ours = dict(zip(groups, (sum(after.proxies[name][0] - cpu for name, (cpu, _) in before.proxies.items()),
                                 after.bench_cpu_s - before.bench_cpu_s), strict=True))
        foreign = [(after.group_busy_s(groups[name]) - before.group_busy_s(groups[name]) - own) / elapsed
                   for name, own in ours.items()]
        if max(foreign) <= FOREIGN_LOAD_WARNING:
            return


async def quietest_phase(
    config: Config, target: Target, concurrency: int, round_index: int, processes: Processes
) -> Measurement:
    """Run a phase; while another workload disturbed it, run it again (at most `noisy_retries` times)."""
    tries: list[Measurement] = []
    while len(tries) <= config.noisy_retries:
        await wait_for_quiet(config, processes)
        tries.append(await measure_phase(config, target, concurrency, round_index, processes))
        print(progress_line(tries[-1]), file=sys.stderr, flush=True)
        if tries[-1].foreign_load <= FOREIGN_LOAD_WARNING:
            break
    return min(tries, key=lambda measured: measured.foreign_load)


async def measure_all(config: Config, targets: list[Target], processes: Processes) -> list[Measurement]:
    await sanity_check(targets, expected_events(config))
    measurements: list[Measurement] = []
    for round_index in range(config.rounds):
        for position, concurrency in enumerate(config.concurrency):
            shift = (round_index + position) % len(targets)
            for target in targets[shift:] + targets[:shift]:
                measurements.append(await quietest_phase(config, target, concurrency, round_index, processes))
    return measurements


async def profile_phase(config: Config, profiled: Target, processes: Processes, output: Path) -> Measurement:
    with pyspy.recording(processes.proxies[profiled.name][0], output, rate_hz=PROFILE_RATE_HZ,
                         native=config.profile_native):
        return await measure_phase(config, profiled, config.profile_concurrency, -1, processes)


def progress_line(measured: Measurement) -> str:
    stats = measured.stats
    return (f"  round {measured.round} c={measured.concurrency:<4} {measured.target:<16} "
            f"{stats.requests_per_s:8.1f} req/s  TTFT p50 {stats.ttft_p50_ms:7.2f} ms  p99 {stats.ttft_p99_ms:7.2f} ms"
            f"  errors {stats.errors}  proxy CPU {measured.proxy_core_busy:5.1%}"
            f"  foreign load {measured.foreign_load:4.0%}")


# -- main ---------------------------------------------------------------------------------------------


PROXY_GROUP = "proxy core"
BENCH_GROUP = "bench cores"


def core_groups(config: Config) -> dict[str, frozenset[int]]:
    """The proxy's core and the bench's (upstream and load generator); busy shares are read per group."""
    return {PROXY_GROUP: frozenset({config.proxy_core}), BENCH_GROUP: bench_cores(config)}


def run(config: Config) -> Outcome:
    check_cores(config)
    os.sched_setaffinity(0, config.client_cores)  # the load generator; the upstream is pinned once started
    with tempfile.TemporaryDirectory(prefix="kvgate-overhead-") as tmp, servers(config, Path(tmp)) as running:
        upstream, proxies, key = running
        trees = {name: procstat.process_tree(proxy.popen.pid) for name, proxy in proxies.items()}
        processes = Processes(trees, upstream.popen.pid, os.getpid(), proxies[GATEWAY].log_path)
        time.sleep(IDLE_SETTLE_S)  # let start-up allocations settle before reading idle RSS
        idle_rss = processes.rss_mib()
        targets = make_targets(config, {DIRECT: upstream.url, **{name: p.url for name, p in proxies.items()}}, key)
        try:
            measurements = uvloop.run(measure_all(config, targets, processes))
            profile = None
            if config.profile_out is not None:
                chosen = next(target for target in targets if target.name == config.profile_target)
                profiled = uvloop.run(profile_phase(config, chosen, processes, config.profile_out))
                profile = profile_summary(config.profile_out, profiled, PROFILE_RATE_HZ)
        except Exception:
            print(f"gateway log tail:\n{proxies[GATEWAY].log_text()[-3000:]}", file=sys.stderr)
            raise
        return Outcome(measurements, idle_rss, processes.rss_mib(), profile)


def report(config: Config, outcome: Outcome, summaries: list[Summary]) -> dict[str, Any]:
    return {
        "config": {**asdict(config), "out": str(config.out),
                   "profile_out": str(config.profile_out) if config.profile_out else None},
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "at": time.strftime("%Y-%m-%dT%H:%M:%S")},
        "expected_events_per_request": expected_events(config),
        "idle_rss_mib": outcome.idle_rss_mib,
        "rss_after_mib": outcome.rss_after_mib,
        "summary": [asdict(summary) for summary in summaries],
        "targets": {**target_checks(summaries), **idle_rss_check(outcome.idle_rss_mib)},
        "noise_warnings": find_noise(outcome.measurements),
        "phases": [asdict(measured) for measured in outcome.measurements],
        "profile": outcome.profile,
    }


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    outcome = run(config)
    measured = {m.target for m in outcome.measurements}
    names = [name for name in (DIRECT, GATEWAY, COMPARED, GRANIAN, *FLOOR_KINDS, NGINX, ROUTER) if name in measured]
    summaries = [summarize(outcome.measurements, concurrency, names) for concurrency in config.concurrency]
    result = report(config, outcome, summaries)
    print_report(result, summaries, print)
    config.out.write_text(json.dumps(without_nan(result), indent=2, default=str) + "\n")
    print(f"wrote {config.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
