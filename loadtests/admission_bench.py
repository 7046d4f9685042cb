"""Cost of offload admission per request: the doorkeeper, the admission key, and the shared (Redis) variant.

    python -m loadtests.admission_bench [--out loadtests/reports/admission-sim-2026-12-01/doorkeeper.json]

- `doorkeeper_observe_us`: one `Doorkeeper.observe` (count and decide) on a tenant sketch of 65,536 x 4 counters
  that already holds `--distinct` prefixes: the part that must stay under 10 us.
- `key_tokens_us`, `key_text_us`: the admission key of an 8,000-token id prompt and of a 32,000-character text
  prompt (only the first `prefix_chunks` chunks are hashed, so the prompt's length does not matter).
- `shared_admit_us`: one `Admission.admit` with a real redis-server on loopback (one EVALSHA round trip), when
  `redis-server` is on PATH; reported as unknown otherwise.
Each figure is the median over `--rounds` rounds of the mean of `--calls` calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from gateway.devtools.localproc import free_port
from gateway.reuse.admission import AdmissionRule, Doorkeeper, prompt_key
from gateway.reuse.fingerprint import tenant_trace_key
from gateway.reuse.shared import Admission

RULE = AdmissionRule("returning", 3600.0, 1, 4)
TRACE_KEY = tenant_trace_key(b"bench-secret", "acme")


def per_call_us(work: Callable[[int], object], calls: int, rounds: int) -> float:
    means = []
    for _ in range(rounds):
        started = time.perf_counter()
        for index in range(calls):
            work(index)
        means.append((time.perf_counter() - started) / calls * 1e6)
    return statistics.median(means)


def keys(count: int) -> list[bytes]:
    return [prompt_key(TRACE_KEY, [(i * 7919 + j) % 30000 + 3 for j in range(256)], 4) or b"" for i in range(count)]


def bench_local(distinct: int, calls: int, rounds: int) -> dict[str, float]:
    keeper = Doorkeeper()
    population = keys(distinct)
    for key in population:
        keeper.observe(key, 0.0, RULE.window_s)
    observe = per_call_us(lambda i: keeper.observe(population[i % distinct], 1.0, RULE.window_s), calls, rounds)
    tokens = [(j * 31) % 30000 + 3 for j in range(8000)]
    text = ("lorem ipsum dolor sit amet " * 1200)[:32000]
    return {
        "doorkeeper_observe_us": observe,
        "key_tokens_us": per_call_us(lambda i: prompt_key(TRACE_KEY, tokens, 4), calls // 4, rounds),
        "key_text_us": per_call_us(lambda i: prompt_key(TRACE_KEY, text, 4), calls // 4, rounds),
        "sketch_bytes_per_tenant": float(keeper.memory_bytes),
    }


async def _shared(url: str, calls: int, rounds: int) -> float:
    client = aioredis.Redis.from_url(url)
    admission = Admission(b"bench-secret", client)
    population = keys(1000)
    means = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            for index in range(calls):
                await admission.admit("acme", population[index % len(population)], RULE)
            means.append((time.perf_counter() - started) / calls * 1e6)
    finally:
        await client.aclose()
    return statistics.median(means)


def bench_shared(calls: int, rounds: int) -> float | None:
    if shutil.which("redis-server") is None:
        return None
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", workdir],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                probe = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
                if probe.stdout.strip() == "PONG":
                    break
                time.sleep(0.05)  # polling while redis-server binds
            return asyncio.run(_shared(f"redis://127.0.0.1:{port}/0", calls, rounds))
        finally:
            server.terminate()
            server.wait(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--distinct", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    result: dict[str, Any] = bench_local(args.distinct, args.calls, args.rounds)
    result["shared_admit_us"] = bench_shared(max(1, args.calls // 50), args.rounds)
    result["machine"] = {"python": platform.python_version(), "cpu": platform.processor() or platform.machine()}
    result["settings"] = {"calls": args.calls, "rounds": args.rounds, "distinct": args.distinct}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
