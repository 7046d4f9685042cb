"""Throughput of `kvgate serve --workers N` against N: does it scale with cores?

Layout: fast upstreams (loadtests.fast_upstream, one process per upstream core, all in the tenant's pool),
the gateway (its parent and each worker pinned to a core of its own out of --gateway-cores; N = 1 is the
plain single-process server, the baseline), and the load on --client-cores: with `--generator python` (the
default) one process per core (this module's `generate` mode, closed-loop streaming clients from
loadtests.loadgen, which time TTFT); with `--generator wrk`, wrk's threads (loadtests/wrk_load.py: a small
fraction of the CPU per answer, so eight workers can be loaded from a 16-core host; no TTFT, the latency of
whole answers instead). Loopback only. For
each N the generators keep `--streams-per-worker × N` streams busy; after a warm-up, requests completed in a
fixed window are counted. Reported per N: requests/s, the efficiency rps(N) / (N × rps(1)) against the issue's
0.85 target, client TTFT p50, and the CPU of every part (gateway workers, upstreams, generators, as cores busy)
so a generator or upstream that ran out of CPU is visible rather than mistaken for the gateway's limit.

`--independent` is the control: instead of one `kvgate serve --workers N`, N separate single-process gateways
(each its own port, state file and core; the generators spread their streams over them), sharing nothing but the
machine. Where they lose as much per added core as the workers do, the loss is the host's (shared caches,
memory, the kernel's loopback path, clock), not the workers' design.

    python -m loadtests.workers_scaling --workers 1,2,4,8 --gateway-cores 0-7 --upstream-cores 8-10 \\
        --client-cores 11-15 --out DIR

It needs only the project's installed dependencies and loopback networking; the report lands in
DIR/report.json and DIR/report.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import uvloop
import yaml

from gateway.devtools.localproc import ServerProcess, free_port, kvgate_command, run_server
from gateway.keys import hash_key, new_key
from loadtests import loadgen, procstat, wrk_load
from loadtests.loadgen import Target
from loadtests.proxy_overhead import OFFLOAD_FEATURES
from loadtests.results import write_json

REPO_ROOT = Path(__file__).resolve().parent.parent
TENANT = "bench"
PROMPT = "Explain in a few words why a per-tenant cache salt keeps prefix caches apart. " * 3
TARGET_EFFICIENCY = 0.85
SATURATED = 0.9  # a generator or upstream process this busy (cores) may be what limits the run
WORKER_BUSY = 0.85  # a gateway worker less busy than this was not the limit: the run did not load it fully
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Config:
    workers: list[int]
    gateway_cores: list[int]
    upstream_cores: list[int]
    client_cores: list[int]
    clients: int
    streams_per_worker: int
    warmup_s: float
    duration_s: float
    rounds: int
    tokens: int
    token_ms: float
    ttft_ms: float
    log_level: str
    out: Path
    listen: str = "shared"  # KVGATE_WORKERS_LISTEN
    independent: bool = False  # the control: N single-process gateways instead of one with N workers
    shared_cores: bool = False  # small boxes only: the parts may share cores (the figures then say so)
    generator: str = "python"  # "python": loadgen processes (TTFT measured); "wrk": wrk (cheap; no TTFT)


def parse_cores(text: str) -> list[int]:
    """`0-3,6` -> [0, 1, 2, 3, 6]."""
    cores: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cores.extend(range(int(low), int(high or low) + 1))
    return cores


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(prog="python -m loadtests.workers_scaling", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8", help="worker counts to measure (comma-separated)")
    parser.add_argument("--gateway-cores", default="0-7", help="cores for the gateway: one per worker")
    parser.add_argument("--upstream-cores", default="8-10", help="cores for the fast upstreams: one process each")
    parser.add_argument("--client-cores", default="11-15", help="cores for the load-generator processes")
    parser.add_argument("--clients", type=int, default=0, help="generator processes (default: one per client core)")
    parser.add_argument("--streams-per-worker", type=int, default=128, help="concurrent streams per gateway worker")
    parser.add_argument("--warmup-s", type=float, default=4.0)
    parser.add_argument("--duration-s", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=1, help="runs per N; the median rate is reported")
    parser.add_argument("--tokens", type=int, default=16, help="streamed tokens per response")
    parser.add_argument("--token-ms", type=float, default=1.0)
    parser.add_argument("--ttft-ms", type=float, default=5.0)
    parser.add_argument("--log-level", default="info", help="the gateway's (info: the per-request log line is on)")
    parser.add_argument("--out", type=Path, required=True, help="directory for report.json and report.md")
    parser.add_argument("--listen", choices=["shared", "reuseport"], default="shared",
                        help="KVGATE_WORKERS_LISTEN: one shared listening socket, or SO_REUSEPORT sockets")
    parser.add_argument("--independent", action="store_true",
                        help="the control: N separate single-process gateways instead of --workers N")
    parser.add_argument("--allow-shared-cores", action="store_true",
                        help="let the core sets overlap (a smoke run on a small box; not a measurement)")
    parser.add_argument("--generator", choices=["python", "wrk"], default="python",
                        help="python: loadgen processes, one per client core (they time TTFT, and cost about "
                             "as much CPU per answer as the gateway); wrk: wrk threads on the client cores "
                             "(loadtests/wrk_load.py; a fraction of the CPU, no TTFT)")
    args = parser.parse_args(argv)
    client_cores = parse_cores(args.client_cores)
    return Config(sorted({int(n) for n in args.workers.split(",")}), parse_cores(args.gateway_cores),
                  parse_cores(args.upstream_cores), client_cores, args.clients or len(client_cores),
                  args.streams_per_worker, args.warmup_s, args.duration_s, args.rounds, args.tokens, args.token_ms,
                  args.ttft_ms, args.log_level, args.out, args.listen, args.independent, args.allow_shared_cores,
                  args.generator)


def check_cores(config: Config) -> None:
    available = procstat.process_affinity(0)
    sets = (set(config.gateway_cores), set(config.upstream_cores), set(config.client_cores))
    every = set().union(*sets)
    if not every <= available:
        raise SystemExit(f"cores {sorted(every - available)} are not available here (have {sorted(available)})")
    if sum(len(cores) for cores in sets) != len(every) and not config.shared_cores:
        raise SystemExit("--gateway-cores, --upstream-cores and --client-cores must not overlap")
    if max(config.workers) > len(config.gateway_cores):
        raise SystemExit(f"{max(config.workers)} workers need as many --gateway-cores (have "
                         f"{len(config.gateway_cores)})")


# -- the parts ------------------------------------------------------------------------------------------


def importable_here() -> dict[str, str]:
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def write_policies(root: Path, upstreams: list[str]) -> str:
    key = new_key()
    gateway = {"pools": {"bench": {"upstreams": upstreams}}, "default_pool": "bench", "public_paths": ["/livez"]}
    tenant = {"tenant": TENANT, "keys": [{"sha256": hash_key(key), "scopes": ["inference"]}],
              "cache": {"isolation": "tenant"}, "offload": dict(OFFLOAD_FEATURES)}
    (root / "tenants").mkdir(parents=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    (root / "tenants" / f"{TENANT}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return key


@contextmanager
def upstreams(config: Config, work: Path) -> Iterator[list[ServerProcess]]:
    with ExitStack() as stack:
        started = []
        for index, core in enumerate(config.upstream_cores):
            port = free_port()
            argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(port),
                    "--ttft-ms", str(config.ttft_ms), "--token-ms", str(config.token_ms),
                    "--tokens", str(config.tokens)]
            server = stack.enter_context(run_server(argv, port, work / f"upstream-{index}.log",
                                                    env=importable_here(), ready_path="/health"))
            procstat.pin_process(server.popen.pid, {core})
            started.append(server)
        yield started


@contextmanager
def gateway(config: Config, work: Path, workers: int, upstream_urls: list[str]) -> Iterator[tuple[ServerProcess, str]]:
    """`kvgate serve` with `workers` (1: the single-process server), each worker pinned to a core of its own."""
    run_dir = work / f"gateway-{workers}"
    run_dir.mkdir()
    key = write_policies(run_dir / "policies", upstream_urls)
    with served(config, run_dir, workers, config.gateway_cores[:workers]) as server:
        yield server, key


@contextmanager
def served(config: Config, run_dir: Path, workers: int, cores: list[int]) -> Iterator[ServerProcess]:
    """`kvgate serve` on the policies in `run_dir`, its parent on `cores` and each worker on one of them."""
    port = free_port()
    env = {"KVGATE_SALT_SECRET": "bench-" + secrets.token_hex(16), "KVGATE_LOG_LEVEL": config.log_level,
           "KVGATE_STATE_PATH": str(run_dir / f"state-{port}.sqlite3"), "KVGATE_WORKERS": str(workers),
           "KVGATE_WORKERS_LISTEN": config.listen}
    argv = kvgate_command("serve", "--policies", str(run_dir / "policies"), "--port", str(port))
    with run_server(argv, port, run_dir / f"gateway-{port}.log", env=env) as server:
        wait_for_workers(server, workers)
        procstat.pin_process(server.popen.pid, set(cores))
        for pid, core in zip(worker_pids(server, workers), cores, strict=True):
            procstat.pin_process(pid, {core})
        yield server


@contextmanager
def independent_gateways(config: Config, work: Path, count: int,
                         upstream_urls: list[str]) -> Iterator[tuple[list[ServerProcess], str]]:
    """The control: `count` single-process gateways on one policy set, each on a core of its own."""
    run_dir = work / f"independent-{count}"
    run_dir.mkdir()
    key = write_policies(run_dir / "policies", upstream_urls)
    with ExitStack() as stack:
        yield [stack.enter_context(served(config, run_dir, 1, [core])) for core in config.gateway_cores[:count]], key


def worker_pids(server: ServerProcess, workers: int) -> list[int]:
    if workers == 1:
        return [server.popen.pid]
    return [pid for pid in procstat.process_tree(server.popen.pid) if pid != server.popen.pid]


def wait_for_workers(server: ServerProcess, workers: int) -> None:
    if workers == 1:
        return
    deadline = time.monotonic() + READY_TIMEOUT_S
    while '"workers_ready"' not in server.log_text():
        if time.monotonic() > deadline or server.popen.poll() is not None:
            raise RuntimeError(f"the workers did not start:\n{server.log_text()[-3000:]}")
        time.sleep(0.1)  # polling the parent's log for its readiness line


def request_body(config: Config, stream: int = 0) -> bytes:
    """Each stream's prompt starts with its own number: the gateway's prefix affinity then spreads the streams
    over every upstream of the pool (one shared prompt would pin them all to one upstream and measure it)."""
    return json.dumps({"model": "m", "max_tokens": config.tokens, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": f"stream {stream}. {PROMPT}"}]}).encode()


# -- generators -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Generated:
    completed: int
    errors: int
    window_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    cpu_s: float  # this generator's own CPU in the window
    answer_p50_ms: float = math.nan  # whole answers (wrk reports these instead of TTFT)


def start_generators(config: Config, url: str, key: str, streams: int, start_at: float,
                     work: Path) -> list[subprocess.Popen[bytes]]:
    shares = [streams // config.clients + (index < streams % config.clients) for index in range(config.clients)]
    started = []
    first_stream = 0
    for index, share in enumerate(shares):
        if share == 0:
            continue
        body = work / f"bodies-{index}.jsonl"
        body.write_bytes(b"\n".join(request_body(config, first_stream + n) for n in range(share)))
        first_stream += share
        core = config.client_cores[index % len(config.client_cores)]
        argv = [sys.executable, "-m", "loadtests.workers_scaling", "generate", "--url", url, "--key", key,
                "--body", str(body), "--streams", str(share), "--start-at", repr(start_at),
                "--warmup-s", str(config.warmup_s), "--duration-s", str(config.duration_s), "--core", str(core)]
        started.append(subprocess.Popen(argv, stdout=subprocess.PIPE, env={**os.environ, **importable_here()}))
    return started


def generate_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="workers_scaling generate")
    for name in ("--url", "--key", "--body"):
        parser.add_argument(name, required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--start-at", type=float, required=True)
    parser.add_argument("--warmup-s", type=float, required=True)
    parser.add_argument("--duration-s", type=float, required=True)
    parser.add_argument("--core", type=int, required=True)
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.core})
    headers = {"content-type": "application/json", "authorization": f"Bearer {args.key}"}
    urls = args.url.split(",")  # several (the control's separate gateways): the streams alternate over them
    bodies = Path(args.body).read_bytes().splitlines()
    targets = [Target("gateway", urls[n % len(urls)], headers, body) for n, body in enumerate(bodies)]
    time.sleep(max(0.0, args.start_at - time.time()))  # every generator starts at the same moment
    run = uvloop.run(loadgen.run_phase(targets, args.streams, args.warmup_s, args.duration_s,
                                       min(1.0, args.warmup_s / 2), lambda: procstat.process_cpu_s(os.getpid())))
    stats = loadgen.summarize(run.samples, run.start.at, run.end.at)
    print(json.dumps(asdict(Generated(stats.completed, stats.errors, stats.window_s, stats.ttft_p50_ms,
                                      stats.ttft_p99_ms, run.end.value - run.start.value))))
    return 0


# -- one measurement ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    workers: int
    requests_per_s: float
    errors: int
    ttft_p50_ms: float
    gateway_cores_busy: float  # CPU seconds of parent and workers / window
    gateway_cpu_ms_per_request: float  # the gateway's CPU per completed request: flat when it scales
    foreign_busy: float  # cores' worth of the gateway's cores used by other processes in the window
    worker_busy: list[float]  # per worker
    upstream_busy: list[float]
    generator_busy: list[float]
    warnings: list[str]
    answer_p50_ms: float = math.nan  # whole answers: what wrk times in place of TTFT


def cpu_of(pids: Sequence[int]) -> list[float]:
    values = []
    for pid in pids:
        try:
            values.append(procstat.process_cpu_s(pid))
        except OSError:
            values.append(math.nan)
    return values


@dataclass(frozen=True)
class Window:
    """CPU seconds at one instant: each worker (or gateway), each upstream, the supervising parent."""

    workers: list[float]
    upstreams: list[float]
    parent: float
    at: float


@contextmanager
def serving(config: Config, workers: int, upstream_list: list[ServerProcess],
            work: Path) -> Iterator[tuple[list[str], str, list[int], int | None]]:
    """Base URLs, key, the serving PIDs (one per core) and the supervising parent's PID (None when there is none)."""
    urls = [server.url for server in upstream_list]
    if config.independent:
        with independent_gateways(config, work, workers, urls) as (servers, key):
            yield [server.url for server in servers], key, [server.popen.pid for server in servers], None
        return
    with gateway(config, work, workers, urls) as (server, key):
        yield [server.url], key, worker_pids(server, workers), server.popen.pid if workers > 1 else None


def measure(config: Config, workers: int, upstream_list: list[ServerProcess], work: Path) -> Measured:
    with serving(config, workers, upstream_list, work) as (bases, key, pids, parent):
        urls = [f"{base}/v1/chat/completions" for base in bases]
        for url in urls:
            sanity(url, key)
        upstream_pids = [up.popen.pid for up in upstream_list]

        def now() -> Window:
            parent_cpu = procstat.process_cpu_s(parent) if parent is not None else 0.0
            return Window(cpu_of(pids), cpu_of(upstream_pids), parent_cpu, time.monotonic())

        drive = drive_wrk if config.generator == "wrk" else drive_python
        driven = drive(config, Load(urls, key, config.streams_per_worker * workers, work), now)
    return measured(config, workers, driven)


@dataclass(frozen=True)
class Load:
    urls: list[str]
    key: str
    streams: int
    work: Path


@dataclass(frozen=True)
class Driven:
    first: Window  # CPU at the window's start and end
    last: Window
    core_busy_s: dict[int, float]  # seconds each core ran tasks in the window
    results: list[Generated]


def core_seconds_between(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """Seconds each core ran tasks between two `procstat.core_busy_s()` readings."""
    return {core: after[core] - before[core] for core in after}


def drive_python(config: Config, load: Load, now: Callable[[], Window]) -> Driven:
    start_at = time.time() + 1.0
    generators = start_generators(config, ",".join(load.urls), load.key, load.streams, start_at, load.work)
    time.sleep(max(0.0, start_at + config.warmup_s - time.time()))  # to the window's start
    cores_before = procstat.core_busy_s()
    first = now()
    time.sleep(config.duration_s)  # the window
    last = now()
    cores_after = procstat.core_busy_s()
    results = [collect(generator) for generator in generators]
    return Driven(first, last, core_seconds_between(cores_before, cores_after), results)


def drive_wrk(config: Config, load: Load, now: Callable[[], Window]) -> Driven:
    """A warm-up run of wrk, then the measured one: the window is that run, from its start to its exit."""
    script = wrk_load.write_script(load.work)
    bodies = load.work / "bodies.jsonl"
    bodies.write_bytes(b"\n".join(request_body(config, stream) for stream in range(load.streams)))
    threads = max(1, len(config.client_cores) // len(load.urls))
    runs = [wrk_load.WrkRun(url, load.key, bodies, load.streams // len(load.urls), threads, config.duration_s)
            for url in load.urls]
    timeout_s = config.warmup_s + config.duration_s + READY_TIMEOUT_S
    warming = [wrk_load.start(replace(run, duration_s=config.warmup_s), script, config.client_cores) for run in runs]
    for process in warming:
        wrk_load.finish(process, timeout_s)
    cores_before = procstat.core_busy_s()
    first = now()
    measuring = [wrk_load.start(run, script, config.client_cores) for run in runs]
    finished = [wrk_load.finish(process, timeout_s) for process in measuring]
    last = now()
    cores_after = procstat.core_busy_s()
    results = [Generated(r.completed, r.errors, r.window_s, math.nan, math.nan, r.cpu_s, r.answer_p50_ms)
               for r in finished]
    return Driven(first, last, core_seconds_between(cores_before, cores_after), results)


def measured(config: Config, workers: int, driven: Driven) -> Measured:
    first, last, results = driven.first, driven.last, driven.results
    window = last.at - first.at
    worker_busy = [(b - a) / window for a, b in zip(first.workers, last.workers, strict=True)]
    parent_busy = (last.parent - first.parent) / window
    upstream_busy = [(b - a) / window for a, b in zip(first.upstreams, last.upstreams, strict=True)]
    generator_busy = [result.cpu_s / result.window_s for result in results]
    warnings = [f"generator {index} was {busy:.0%} busy: the load may be generator-bound"
                for index, busy in enumerate(generator_busy) if busy > SATURATED * generator_cores(config)]
    warnings += [f"upstream {index} was {busy:.0%} busy: the load may be upstream-bound"
                 for index, busy in enumerate(upstream_busy) if busy > SATURATED]
    warnings += [f"worker {index} was only {busy:.0%} busy: the gateway was not the limit (more streams?)"
                 for index, busy in enumerate(worker_busy) if busy < WORKER_BUSY]
    errors = sum(result.errors for result in results)
    if errors:
        warnings.append(f"{errors} requests failed")
    gateway_busy = sum(worker_busy) + parent_busy
    cores_busy = sum(driven.core_busy_s[core] for core in config.gateway_cores[:workers]) / window
    foreign = max(0.0, cores_busy - gateway_busy)
    if foreign > 0.1 * workers:
        warnings.append(f"other processes used {foreign:.2f} cores of the gateway's cores")
    rate = sum(result.completed / result.window_s for result in results)
    return Measured(workers, rate, errors, statistics.median(result.ttft_p50_ms for result in results),
                    gateway_busy, gateway_busy / rate * 1000 if rate else math.nan, foreign, worker_busy,
                    upstream_busy, generator_busy, warnings,
                    statistics.median(result.answer_p50_ms for result in results))


def generator_cores(config: Config) -> float:
    """Cores one generator process may use: one for a Python generator; a wrk process runs a thread per client
    core it was given."""
    return 1.0 if config.generator == "python" else float(max(1, len(config.client_cores)))


def collect(generator: subprocess.Popen[bytes]) -> Generated:
    out, _ = generator.communicate(timeout=READY_TIMEOUT_S)
    if generator.returncode != 0:
        raise RuntimeError(f"a load generator failed with status {generator.returncode}")
    return Generated(**json.loads(out))


def sanity(url: str, key: str) -> None:
    async def one() -> loadgen.Sample:
        target = Target("gateway", url, {"content-type": "application/json", "authorization": f"Bearer {key}"},
                        json.dumps({"model": "m", "max_tokens": 4, "stream": True,
                                    "messages": [{"role": "user", "content": "hi"}]}).encode())
        async with loadgen.new_session(1) as session:
            return await loadgen.one_request(session, target)

    if not uvloop.run(one()).ok:
        raise RuntimeError(f"a streamed request through the gateway at {url} failed")


# -- the report -----------------------------------------------------------------------------------------


def report(config: Config, runs: dict[int, list[Measured]]) -> dict[str, Any]:
    chosen = {workers: sorted(measured, key=lambda m: m.requests_per_s)[len(measured) // 2]
              for workers, measured in runs.items()}
    base = chosen.get(1)
    rows = []
    for workers, measured in sorted(chosen.items()):
        efficiency = measured.requests_per_s / (workers * base.requests_per_s) if base else None
        rows.append({**asdict(measured), "efficiency": efficiency,
                     "meets_target": None if efficiency is None else efficiency >= TARGET_EFFICIENCY,
                     "rounds_rps": [m.requests_per_s for m in runs[workers]]})
    return {"config": {**asdict(config), "out": str(config.out)}, "target_efficiency": TARGET_EFFICIENCY,
            "host_cpus": os.cpu_count(), "rows": rows}


def client_latency(row: dict[str, Any]) -> str:
    """TTFT where the generators timed it (Python), else the whole answer's latency (wrk)."""
    ttft, answer = row["ttft_p50_ms"], row.get("answer_p50_ms", math.nan)
    if not math.isnan(ttft):
        return f"TTFT {ttft:.2f} ms"
    return f"answer {answer:.2f} ms" if not math.isnan(answer) else "not measured"


def markdown(result: dict[str, Any]) -> str:
    what = "gateways" if result["config"]["independent"] else "workers"
    lines = [f"| {what} | requests/s | ÷ (N × rps(1)) | client latency p50 | gateway cores busy | "
             "gateway CPU per request | per worker | upstreams busy | generators busy | others on gateway cores | "
             "errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        efficiency = "unknown (no N=1 run)" if row["efficiency"] is None else f"{row['efficiency']:.3f}"
        lines.append(
            f"| {row['workers']} | {row['requests_per_s']:.0f} | {efficiency} | {client_latency(row)} | "
            f"{row['gateway_cores_busy']:.2f} | {row['gateway_cpu_ms_per_request']:.3f} ms | "
            f"{', '.join(f'{b:.0%}' for b in row['worker_busy'])} | "
            f"{', '.join(f'{b:.0%}' for b in row['upstream_busy'])} | "
            f"{', '.join(f'{b:.0%}' for b in row['generator_busy'])} | {row['foreign_busy']:.2f} | {row['errors']} |")
    warnings = [f"- N={row['workers']}: {warning}" for row in result["rows"] for warning in row["warnings"]]
    config = result["config"]
    return "\n".join([
        ("# N separate single-process gateways (the control for --workers N): throughput" if config["independent"]
         else f"# kvgate serve --workers N: throughput (target ≥ {TARGET_EFFICIENCY} × N × rps(1))"), "",
        f"Host CPUs: {result['host_cpus']}; gateway cores {config['gateway_cores']}, upstream cores "
        f"{config['upstream_cores']}, client cores {config['client_cores']} ({config['clients']} generator "
        f"{'processes' if config['generator'] == 'python' else 'cores for wrk'}); "
        f"{config['streams_per_worker']} streams per worker; streamed chat, {config['tokens']} tokens, "
        f"TTFT {config['ttft_ms']} ms, {config['token_ms']} ms apart; {config['warmup_s']} s warm-up, "
        f"{config['duration_s']} s window, {config['rounds']} round(s) (the median round by rate; the upper one of "
        f"two); listening: {config['listen']}.",
        "", *lines, "",
        *(["Warnings:", *warnings] if warnings else ["No part other than the gateway ran out of CPU."]),
        *(["", "**The core sets overlapped (--allow-shared-cores): a smoke run, not a measurement.**"]
          if config["shared_cores"] else []), ""])


def run(config: Config) -> dict[str, Any]:
    check_cores(config)
    config.out.mkdir(parents=True, exist_ok=True)
    runs: dict[int, list[Measured]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-workers-bench-") as temp:
        work = Path(temp)
        with upstreams(config, work) as upstream_list:
            for round_index in range(config.rounds):
                for workers in config.workers:
                    round_dir = work / f"round-{round_index}"
                    round_dir.mkdir(exist_ok=True)
                    measured = measure(config, workers, upstream_list, round_dir)
                    runs.setdefault(workers, []).append(measured)
                    print(f"workers={workers} rps={measured.requests_per_s:.0f} "
                          f"gateway_busy={measured.gateway_cores_busy:.2f} "
                          f"generators={[round(b, 2) for b in measured.generator_busy]} "
                          f"upstreams={[round(b, 2) for b in measured.upstream_busy]}", flush=True)
    result = report(config, runs)
    write_json(result, config.out / "report.json")
    (config.out / "report.md").write_text(markdown(result))
    return result


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["generate"]:
        return generate_main(args[1:])
    result = run(parse_args(args))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
