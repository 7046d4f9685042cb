"""Noisy neighbour: tenant A sends ten times its per-minute limit while tenant B streams at c=8.

Fast benchmark upstream (first token after 50 ms, 16 tokens 5 ms apart). Tenant A has
`limits.requests_per_minute: 600` and sends 100 streaming requests per second, open loop (ten times its
limit); tenant B has no limits and runs a closed loop at c=8. Phases: B alone, B with A, B alone again.
Reported: B's TTFT p50/p99 per phase and the change against the mean of its solo runs, and every status A
received (only 200 and 429 are expected).

    .venv/bin/python -m loadtests.noisy_neighbour --out loadtests/reports/hardening-2026-12-01/noisy_neighbour.json
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from loadtests import loadgen
from loadtests.hardening_stack import Stack, fast_upstream, gateway_stack, raise_open_files, stream_body
from loadtests.loadgen import Target
from loadtests.results import print_and_write_json

A_LIMIT_PER_MINUTE = 600


async def one_noisy(session: aiohttp.ClientSession, target: Target, statuses: Counter[str]) -> None:
    try:
        async with session.post(target.url, data=target.body, headers=target.headers) as response:
            await response.read()
            statuses[str(response.status)] += 1
    except (aiohttp.ClientError, TimeoutError) as error:
        statuses[type(error).__name__] += 1


async def noisy(target: Target, rate_per_s: float, stop_at: float, statuses: Counter[str]) -> None:
    """Open loop: one request every 1/rate seconds, whatever the answers take."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session, \
            asyncio.TaskGroup() as group:
        interval = 1.0 / rate_per_s
        next_at = time.perf_counter()
        while next_at < stop_at:
            group.create_task(one_noisy(session, target, statuses))
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


async def phase(b: Target, a: Target | None, args: argparse.Namespace, statuses: Counter[str]) -> loadgen.PhaseStats:
    # With A, the warm-up outlasts A's permitted burst (a per-minute budget of 600 is spent in 6 s at 100/s),
    # so the window sees A's steady state: 10 admitted and 90 refused per second.
    warmup = 10.0 if a is not None else 3.0
    stop_at = time.perf_counter() + warmup + args.duration
    async with asyncio.TaskGroup() as group:
        if a is not None:
            group.create_task(noisy(a, A_LIMIT_PER_MINUTE / 60 * args.factor, stop_at, statuses))
        run = await loadgen.run_phase(b, args.concurrency, warmup, args.duration, 1.0, time.perf_counter)
    return loadgen.summarize(run.samples, run.start.value, run.end.value)


def measure(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    body = stream_body()
    b = Target("b", stack.completion_url(), stack.headers("b"), body)
    a = Target("a", stack.completion_url(), stack.headers("a"), body)
    statuses: Counter[str] = Counter()
    solo = uvloop.run(phase(b, None, args, statuses))
    shared = uvloop.run(phase(b, a, args, statuses))
    solo_again = uvloop.run(phase(b, None, args, statuses))
    baseline = (solo.ttft_p50_ms + solo_again.ttft_p50_ms) / 2
    return {
        "setup": {"a_limit_per_minute": A_LIMIT_PER_MINUTE, "a_rate_per_s": A_LIMIT_PER_MINUTE / 60 * args.factor,
                  "b_concurrency": args.concurrency, "window_s": args.duration,
                  "upstream": "fast_upstream ttft 50 ms, 16 tokens x 5 ms"},
        "b_phases": {"solo": asdict(solo), "with_a": asdict(shared), "solo_again": asdict(solo_again)},
        "b_ttft_p50_change_pct": round((shared.ttft_p50_ms - baseline) / baseline * 100, 2),
        "a_statuses": dict(statuses),
        "a_only_200_and_429": set(statuses) <= {"200", "429"},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.noisy_neighbour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvgate-noisy"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--factor", type=float, default=10.0, help="A's offered rate as a multiple of its limit")
    parser.add_argument("--duration", type=float, default=30.0)
    args = parser.parse_args(argv)
    raise_open_files()
    tenants = {"a": {"limits": {"requests_per_minute": A_LIMIT_PER_MINUTE}}, "b": {}}
    with gateway_stack(args.work, fast_upstream(args.work, ttft_ms=50, token_ms=5, tokens=16), tenants) as stack:
        result = measure(stack, args)
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
