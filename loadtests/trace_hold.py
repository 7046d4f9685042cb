"""How long the reuse trace's background hashing holds the event loop: what every other stream of the process waits.

A burst of long sampled prompts is queued (`--requests` requests of `--tokens` tokens, text or token ids, each body
decoded as the gateway's rewrite holds it, long prompts kept as JSON text, then read and queued as the reuse
trace's finish hook does once the reply is sent). Each finish holds the loop too: its longest is `finish_ms`. Then
the background hashing runs as a task while a probe task yields to the loop again and again. The longest gap
between two of the probe's turns is the longest time a stream's next event would have waited on that hashing; the
total is the wall time until the last chain was done, the probe's own turns included (not the hashing's CPU). A
real SQLite trace store, the gateway's collector settings. Run it beside an earlier tree with PYTHONPATH to compare:

    .venv/bin/python -m loadtests.trace_hold [--requests 8] [--tokens 128000] [--rounds 5] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.http.process import settle_gc
from gateway.proxy.rawprompt import decode_request
from gateway.proxy.sse import Usage
from gateway.reuse import fingerprint
from gateway.reuse.store import SqliteTraceStore
from gateway.reuse.trace import FinishedRequest, ReuseTrace, TraceMetrics, TraceSettings
from gateway.storage.sqlite import SqliteWorker
from gateway.tasks import TaskSupervisor
from loadtests.reuse_trace_cost import bodies, policies


async def one_round(store: SqliteTraceStore, folder: Path, shape: str, tokens: int, requests: int,
                    round_: int) -> dict[str, float]:
    policy_set = policies(folder / f"policies-{shape}-{round_}")
    trace = ReuseTrace(store, b"benchmark-secret", TraceSettings(max_roots=10**9), TraceMetrics(CollectorRegistry()),
                       lambda: policy_set)
    usage = Usage(prompt_tokens=tokens, cached_tokens=0, completion_tokens=1)
    finishes: list[float] = []
    for index in range(requests):  # distinct documents: every one is sampled and hashed whole
        request = decode_request(json.dumps(bodies(shape, tokens, round_ * requests + index, hot=False)).encode())
        began = time.perf_counter()
        trace.observe(FinishedRequest("acme", 1, "main", finish_parts(request), usage))
        finishes.append(time.perf_counter() - began)
    tasks = TaskSupervisor("trace-hold")
    began = time.perf_counter()
    hashing = tasks.spawn(trace.hash_pending(), "hash")
    longest, last = 0.0, time.perf_counter()
    while not hashing.done():
        await asyncio.sleep(0)
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    total = time.perf_counter() - began
    await hashing
    await trace.flush()
    await tasks.close()
    return {"longest_hold_ms": longest * 1000, "total_ms": total * 1000, "finish_ms": max(finishes) * 1000}


def finish_parts(request: dict[str, Any]) -> Any:
    """What the finish hook hands the trace: `trace_parts` since 2026-12-03 (sixth session), `canonical_parts` in
    earlier trees, which this benchmark also runs in."""
    if hasattr(fingerprint, "trace_parts"):
        return fingerprint.trace_parts(request, TraceSettings().block_tokens)
    return fingerprint.canonical_parts(request)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-trace-hold-") as scratch:
        folder = Path(scratch)
        worker = await SqliteWorker.open(folder / "trace.sqlite3")
        store = await SqliteTraceStore.open(worker)
        settle_gc()
        for shape in args.shapes:
            rounds = [await one_round(store, folder, shape, args.tokens, args.requests, r) for r in range(args.rounds)]
            holds = [r["longest_hold_ms"] for r in rounds]
            totals = [r["total_ms"] for r in rounds]
            finishes = [r["finish_ms"] for r in rounds]
            results[shape] = {"rounds": rounds, "longest_hold_ms_median": statistics.median(holds),
                              "total_ms_median": statistics.median(totals),
                              "finish_ms_median": statistics.median(finishes)}
            print(f"{shape:<5} {args.requests} × {args.tokens} tokens: longest finish median "
                  f"{statistics.median(finishes):.2f} ms; longest hold of the loop while hashing median "
                  f"{statistics.median(holds):.2f} ms (max {max(holds):.2f}), done after "
                  f"{statistics.median(totals):.1f} ms", flush=True)
        await worker.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.trace_hold", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=128_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", choices=("text", "chat", "ids"), default=["text", "ids"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = asyncio.run(run(args))
    if args.out is not None:
        args.out.write_text(json.dumps({"requests": args.requests, "tokens": args.tokens, "results": results},
                                       indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
