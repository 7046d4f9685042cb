"""Where a proxy's CPU goes at the C level, compared between two proxies of the proxy-overhead benchmark.

py-spy's non-blocking samples of an asyncio process lose much of the interpreter's time to the event loop's
frame, so they cannot say how much of kvgate's cost above the bare ASGI relay (loadtests/floor_relay.py) is
Python code and how much is the kernel. `perf record` (cpu-clock, user and kernel, call graphs) can. This runs
the benchmark's servers, drives `--concurrency` streams at each chosen proxy in turn while perf samples its
process, and prints samples per request by shared object (libpython, kernel, uvloop, ...) and the interpreter
functions whose share differs most.

    .venv/bin/python -m loadtests.perf_attribution --out /tmp/attribution --targets gateway floor-asgi

Needs `perf` on PATH and a `kernel.perf_event_paranoid` that lets a user record their own processes (≤ 2).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import uvloop

from loadtests import loadgen
from loadtests import proxy_overhead as bench

RATE_HZ = 2000
INTERPRETER = "libpython"


async def drive(target: loadgen.Target, concurrency: int, duration_s: float, spread_s: float) -> int:
    run = await loadgen.run_phase(target, concurrency, 2.0, duration_s, spread_s, lambda: 0)
    return len(run.samples)


def perf_report(data: Path, field: str, *filters: str) -> list[tuple[int, str]]:
    """(samples, name) rows of one recording, grouped by `field` (dso or sym), e.g. filtered by `--dsos X`."""
    argv = ["perf", "report", "-i", str(data), "--stdio", "-g", "none", "--no-children", "-F", f"sample,{field}",
            *filters]
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    rows = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#") and parts[0].isdigit():
            rows.append((int(parts[0]), parts[-1]))
    return rows


def record(config: bench.Config, names: Sequence[str], out: Path) -> dict[str, int]:
    """Requests completed per proxy while perf recorded it (to `out/<name>.data`)."""
    os.sched_setaffinity(0, config.client_cores)
    completed: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-perf-") as tmp, bench.servers(config, Path(tmp)) as running:
        _, proxies, key = running
        targets = {t.name: t for t in bench.make_targets(config, {n: p.url for n, p in proxies.items()}, key)}
        for name in names:
            argv = ["perf", "record", "-q", "-e", "cpu-clock", "-F", str(RATE_HZ), "-g",
                    "-p", str(proxies[name].popen.pid), "-o", str(out / f"{name}.data")]
            perf = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                completed[name] = uvloop.run(drive(targets[name], config.concurrency[0], config.duration_s,
                                                   config.stream_s))
            finally:
                perf.send_signal(signal.SIGINT)
                perf.wait(timeout=60)
    return completed


def print_attribution(names: Sequence[str], completed: dict[str, int], out: Path) -> None:
    us_per_sample = 1e6 / RATE_HZ
    per_dso = {name: dict((dso, n) for n, dso in perf_report(out / f"{name}.data", "dso")) for name in names}
    print("µs of CPU per request, by shared object (perf cpu-clock samples during the window and warm-up):")
    dsos = sorted({dso for rows in per_dso.values() for dso in rows}, key=lambda d: -per_dso[names[0]].get(d, 0))
    print(f"{'':44s}" + "".join(f"{name:>16s}" for name in names))
    for dso in dsos[:10]:
        print(f"{dso[:44]:44s}" + "".join(
            f"{per_dso[name].get(dso, 0) * us_per_sample / completed[name]:16.1f}" for name in names))
    print(f"{'total':44s}" + "".join(
        f"{sum(per_dso[name].values()) * us_per_sample / completed[name]:16.1f}" for name in names))
    symbols = {name: {sym: n for n, sym in perf_report(out / f"{name}.data", "sym", "--dsos",
                                                      python_dso(per_dso[name]))} for name in names}
    first, second = names[0], names[-1]

    def per_request(name: str, sym: str) -> float:
        return symbols[name].get(sym, 0) * us_per_sample / completed[name]

    print(f"\ninterpreter functions, µs per request, {first} against {second} (largest differences):")
    for sym in sorted(set(symbols[first]) | set(symbols[second]),
                      key=lambda s: per_request(second, s) - per_request(first, s))[:15]:
        print(f"  {per_request(first, sym):8.1f} {per_request(second, sym):8.1f}  {sym}")


def python_dso(dsos: dict[str, int]) -> str:
    return next((dso for dso in dsos if dso.startswith(INTERPRETER)), INTERPRETER)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the perf recordings")
    parser.add_argument("--targets", nargs="+", default=["gateway", "floor-asgi"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    config = bench.parse_args(["--out", str(args.out / "unused.json"), "--floors", "--no-nginx", "--no-router",
                               "--concurrency", str(args.concurrency), "--duration", str(args.duration),
                               "--tokens", str(args.tokens)])
    completed = record(config, args.targets, args.out)
    print_attribution(args.targets, completed, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
