"""Soak: many concurrent streams through the gateway on `kvgate sim` for minutes, watching for errors,
memory growth and descriptor leaks.

Closed loop: `--concurrency` workers (default 1,000) each send one streaming completion after another
(16 tokens) for `--minutes` (default 10). Every 10 s the gateway's RSS and open descriptors are sampled.
Reported: requests completed, errors (any request not ending in `data: [DONE]` with a 200), TTFT p50/p99,
RSS at minute 1 and at the end, and the descriptor series.

    nohup .venv/bin/python -m loadtests.soak --out loadtests/reports/hardening-2026-12-01/soak.json \
        > /tmp/soak.log 2>&1 &
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvloop

from loadtests import loadgen
from loadtests.hardening_stack import gateway_stack, open_fds, raise_open_files, rss_mib, simulator, stream_body
from loadtests.loadgen import Target
from loadtests.results import print_and_write_json

SAMPLE_EVERY_S = 10.0
SIM_FLAGS = ("--base-ttft-ms", "5", "--prefill-us-per-token", "2", "--decode-ms-per-token", "2",
             "--record-limit", "100")


async def sample(pid: int, stop_at: float, series: list[dict[str, float]]) -> None:
    started = time.monotonic()
    while time.monotonic() < stop_at:
        series.append({"t_s": round(time.monotonic() - started, 1), "rss_mib": round(rss_mib(pid), 1),
                       "fds": open_fds(pid)})
        await asyncio.sleep(SAMPLE_EVERY_S)  # the sampling period, not synchronisation


async def soak(target: Target, pid: int, concurrency: int, seconds: float) -> tuple[loadgen.PhaseStats, list[Any]]:
    series: list[dict[str, float]] = []
    warmup = 5.0
    async with asyncio.TaskGroup() as group:
        group.create_task(sample(pid, time.monotonic() + warmup + seconds + 1, series))
        run = await loadgen.run_phase(target, concurrency, warmup, seconds, 5.0, time.perf_counter)
    return loadgen.summarize(run.samples, run.start.value, run.end.value), series


def at_or_after(series: list[dict[str, float]], t_s: float) -> dict[str, float]:
    return next((point for point in series if point["t_s"] >= t_s), series[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=1000)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvgate-soak"))
    args = parser.parse_args(argv)
    raise_open_files()  # inherited by the simulator and the gateway too
    with gateway_stack(args.work, simulator(args.work, *SIM_FLAGS), {"soak": {}}) as stack:
        target = Target("soak", stack.completion_url(), stack.headers("soak"), stream_body(16))
        stats, series = uvloop.run(soak(target, stack.gateway.popen.pid, args.concurrency, args.minutes * 60))
        final = {"rss_mib": round(rss_mib(stack.gateway.popen.pid), 1), "fds": open_fds(stack.gateway.popen.pid)}
    minute_1 = at_or_after(series, 60.0)
    result = {
        "setup": {"concurrency": args.concurrency, "minutes": args.minutes, "sim_flags": list(SIM_FLAGS),
                  "max_tokens": 16},
        "stats": asdict(stats),
        "rss_minute_1_mib": minute_1["rss_mib"], "rss_end_mib": series[-1]["rss_mib"],
        "rss_end_over_minute_1_pct": round((series[-1]["rss_mib"] / minute_1["rss_mib"] - 1) * 100, 2),
        "fds_minute_1": minute_1["fds"], "fds_end": series[-1]["fds"], "after_load": final,
        "series": series,
    }
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
