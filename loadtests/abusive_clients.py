"""Slow and abusive clients against a tenant's streams.

A tenant streams at c=32 through the gateway (fast benchmark upstream: first token after 50 ms, 16 tokens
5 ms apart). Phases: baseline, then the same load while a separate process holds 1,000 idle connections
(they never send a byte) and 100 slow-header connections (one header byte per second), reopening each one
the gateway closes, then baseline again. Reported: the tenant's TTFT p50/p99 per phase, the gateway's RSS
(end of the first baseline, peak while abused) and open descriptors, and for every abusive connection how
long the gateway let it live. Gateway settings are the defaults (head deadline 10 s, idle deadline 15 s).

    .venv/bin/python -m loadtests.abusive_clients --out loadtests/reports/hardening-2026-12-01/abusive_clients.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import uvloop

from loadtests import loadgen
from loadtests.hardening_stack import (
    Stack,
    fast_upstream,
    gateway_stack,
    importable_here,
    open_fds,
    raise_open_files,
    rss_mib,
    stream_body,
)
from loadtests.loadgen import Target
from loadtests.results import print_and_write_json

HEADER_DEADLINE_S = 10.0
IDLE_DEADLINE_S = 15.0
SLACK_S = 2.0  # a close this much after the deadline still counts as "by the deadline" (timer and loop jitter)


# -- the abusive process ----------------------------------------------------------------------------


async def hold(port: int, slow: bool, stop_at: float, lifetimes: list[float], opened: list[int]) -> None:
    """One abusive slot: connect, idle or trickle a header, and reconnect each time the gateway closes it."""
    while time.monotonic() < stop_at:
        started = time.monotonic()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)  # back off from a refused connect
            continue
        opened[0] += 1
        closed = await wait_closed(reader, writer, slow, stop_at)
        if closed:
            lifetimes.append(time.monotonic() - started)
        writer.close()


async def wait_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, slow: bool, stop_at: float) -> bool:
    """True when the gateway closed the connection, False when the run ended first."""
    if slow:
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    while time.monotonic() < stop_at:
        try:
            if slow:
                writer.write(b"a")
                await writer.drain()
            wait_s = 1.0 if slow else max(0.01, stop_at - time.monotonic())
            data = await asyncio.wait_for(reader.read(4096), timeout=wait_s)
        except TimeoutError:
            continue
        except OSError:
            return True
        if not data:
            return True
        if data.startswith(b"HTTP/1.1"):
            continue  # the 408 answer; the close follows
    return False


async def abuse(port: int, idle: int, slow: int, duration_s: float) -> dict[str, Any]:
    stop_at = time.monotonic() + duration_s
    idle_lifetimes: list[float] = []
    slow_lifetimes: list[float] = []
    opened_idle, opened_slow = [0], [0]
    tasks = [hold(port, False, stop_at, idle_lifetimes, opened_idle) for _ in range(idle)]
    tasks += [hold(port, True, stop_at, slow_lifetimes, opened_slow) for _ in range(slow)]
    await asyncio.gather(*tasks)
    return {
        "idle": summary(idle_lifetimes, opened_idle[0], IDLE_DEADLINE_S),
        "slow_header": summary(slow_lifetimes, opened_slow[0], HEADER_DEADLINE_S),
    }


def summary(lifetimes: list[float], opened: int, deadline_s: float) -> dict[str, Any]:
    late = [life for life in lifetimes if life > deadline_s + SLACK_S]
    return {"opened": opened, "closed_by_gateway": len(lifetimes), "deadline_s": deadline_s,
            "lifetime_max_s": round(max(lifetimes), 2) if lifetimes else None,
            "lifetime_min_s": round(min(lifetimes), 2) if lifetimes else None, "closed_late": len(late)}


# -- the benchmark ----------------------------------------------------------------------------------


class Sampler:
    """Samples the gateway's RSS and descriptors every 0.5 s in a thread, keeping the peaks."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss_mib = 0.0
        self.peak_fds = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.peak_rss_mib = max(self.peak_rss_mib, rss_mib(self.pid))
            self.peak_fds = max(self.peak_fds, open_fds(self.pid))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def phase(target: Target, concurrency: int, duration_s: float) -> loadgen.PhaseStats:
    run = uvloop.run(loadgen.run_phase(target, concurrency, 3.0, duration_s, 1.0, time.perf_counter))
    return loadgen.summarize(run.samples, run.start.value, run.end.value)


def run(args: argparse.Namespace) -> dict[str, Any]:
    upstream = fast_upstream(args.work, ttft_ms=50, token_ms=5, tokens=16)
    with gateway_stack(args.work, upstream, {"streamer": {}}) as stack:
        return measure(stack, args)


def measure(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    pid = stack.gateway.popen.pid
    target = Target("streamer", stack.completion_url(), stack.headers("streamer"), stream_body())
    before = phase(target, args.concurrency, args.duration)
    rss_before, fds_before = rss_mib(pid), open_fds(pid)
    ready = args.work / "abuser.ready"
    ready.unlink(missing_ok=True)
    abuser_seconds = args.duration + 3.0 + IDLE_DEADLINE_S + HEADER_DEADLINE_S + 5.0
    command = [sys.executable, "-m", "loadtests.abusive_clients", "--abuse", str(stack.gateway.port), "--idle",
               str(args.idle), "--slow", str(args.slow), "--abuse-seconds", str(abuser_seconds),
               "--work", str(args.work)]
    abuser = subprocess.Popen(command, stdout=subprocess.PIPE, env={**os.environ, **importable_here()})
    deadline = time.monotonic() + 60
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.1)  # polling for the abuser's connections to open
    with Sampler(pid) as sampler:
        abused = phase(target, args.concurrency, args.duration)
        out, _ = abuser.communicate(timeout=abuser_seconds + 60)
    after = phase(target, args.concurrency, args.duration)
    connections = json.loads(out)
    baseline_p50 = (before.ttft_p50_ms + after.ttft_p50_ms) / 2
    return {
        "setup": {"concurrency": args.concurrency, "window_s": args.duration, "idle_connections": args.idle,
                  "slow_header_connections": args.slow, "header_deadline_s": HEADER_DEADLINE_S,
                  "idle_deadline_s": IDLE_DEADLINE_S, "upstream": "fast_upstream ttft 50 ms, 16 tokens x 5 ms"},
        "phases": {"before": asdict(before), "abused": asdict(abused), "after": asdict(after)},
        "ttft_p50_change_pct": round((abused.ttft_p50_ms - baseline_p50) / baseline_p50 * 100, 2),
        "gateway": {"rss_before_mib": round(rss_before, 1), "rss_peak_abused_mib": round(sampler.peak_rss_mib, 1),
                    "rss_growth_mib": round(sampler.peak_rss_mib - rss_before, 1), "fds_before": fds_before,
                    "fds_peak_abused": sampler.peak_fds, "fds_after": open_fds(pid)},
        "abusive_connections": connections,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.abusive_clients", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvgate-abusive"))
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slow", type=int, default=100)
    parser.add_argument("--abuse", type=int, help=argparse.SUPPRESS)  # internal: run as the abusive process
    parser.add_argument("--abuse-seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    raise_open_files()
    if args.abuse:
        (args.work / "abuser.ready").write_text("ready")  # the connections open within the warm-up that follows
        result = uvloop.run(abuse(args.abuse, args.idle, args.slow, args.abuse_seconds))
        print(json.dumps(result))
        return 0
    result = run(args)
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
