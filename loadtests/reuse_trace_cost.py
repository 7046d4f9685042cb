"""What the reuse trace costs per request: the synchronous part on the request path, and the deferred hashing.

The reuse-trace feature's synchronous work — `canonical_parts` and `ReuseTrace.observe`, both once the reply has
been sent — is timed in-process on real request bodies, for
prompts of several shapes and sizes, in three regimes:

- `new roots, sampled`: every request starts a new prefix chain and the sampler keeps it (worst case for the
  request path: first-chunk hash, sampler insert, queueing);
- `hot roots, sampled`: the same few documents again and again (the common case);
- `unsampled`: the root falls above the sampling threshold (what most requests pay once the fixed-size bound
  has lowered the rate).

The background task then hashes every queued chain; that is timed separately (µs per sampled request), as the
CPU it takes from the event loop between requests. Run:

    .venv/bin/python -m loadtests.reuse_trace_cost [--requests 2000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.http.process import settle_gc
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.proxy.sse import Usage
from gateway.reuse.fingerprint import canonical_parts
from gateway.reuse.record import TraceRecord
from gateway.reuse.store import DEFAULT_MAX_RECORDS, SqliteTraceStore
from gateway.reuse.trace import FinishedRequest, ReuseTrace, TraceMetrics, TraceSettings
from gateway.storage.sqlite import SqliteWorker

BATCH = 20
WORDS = ("cache", "tier", "block", "prefix", "token", "offload", "memory", "request", "tenant", "policy")


def text_of(tokens: int, seed: int) -> str:
    rng = random.Random(seed)
    words: list[str] = []
    length = 0
    while length < tokens * 4:  # about 4 characters per token
        word = rng.choice(WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def bodies(shape: str, tokens: int, index: int, hot: bool) -> dict[str, Any]:
    seed = index % 4 if hot else index + 1000
    if shape == "text":
        return {"model": "m", "prompt": f"{seed} " + text_of(tokens, seed)}
    if shape == "chat":
        return {"model": "m", "messages": [{"role": "system", "content": f"{seed} " + text_of(tokens // 2, seed)},
                                           {"role": "user", "content": text_of(tokens // 2, seed + 1)}]}
    rng = random.Random(seed)
    return {"model": "m", "prompt": [rng.randrange(3, 32000) for _ in range(tokens)]}


def policies(root: Path) -> PolicySet:
    (root / "tenants").mkdir(parents=True)
    (root / "gateway.yaml").write_text("pools: {main: {upstreams: ['http://127.0.0.1:1']}}\ndefault_pool: main\n")
    (root / "tenants" / "acme.yaml").write_text("tenant: acme\n")
    return load_policy_set(root)


def measure(trace: ReuseTrace, requests: list[dict[str, Any]], usage: Usage) -> tuple[list[float], float, int]:
    """Per-request µs of `observe` (medians of batches), background µs per sampled request, sampled count."""
    per_batch: list[float] = []
    background_ns = 0
    sampled = 0
    for start in range(0, len(requests), BATCH):
        batch = requests[start : start + BATCH]
        began = time.process_time_ns()
        outcomes = [trace.observe(FinishedRequest("acme", 1, "main", canonical_parts(body), usage)) for body in batch]
        per_batch.append((time.process_time_ns() - began) / len(batch) / 1000)
        sampled += outcomes.count("sampled")
        began = time.process_time_ns()
        asyncio.run(trace.hash_pending())
        background_ns += time.process_time_ns() - began
        asyncio.run(trace.flush())  # the store write (a worker thread, batched) is not part of either figure
    return per_batch, background_ns / max(sampled, 1) / 1000, sampled


def regime(store: SqliteTraceStore, policy_set: PolicySet, shape: str, tokens: int, kind: str,
           count: int) -> dict[str, Any]:
    settings = TraceSettings(sample_rate=0.0 if kind == "unsampled" else 1.0, max_roots=10**9)
    trace = ReuseTrace(store, b"benchmark-secret", settings, TraceMetrics(CollectorRegistry()),
                       lambda: policy_set)
    requests = [bodies(shape, tokens, index, hot=kind == "hot roots, sampled") for index in range(count)]
    usage = Usage(prompt_tokens=tokens, cached_tokens=0, completion_tokens=1)
    # The gateway's own collector settings; the pre-built bodies (thousands of long lists, which a real gateway
    # never holds at once) are frozen so that collections do not rescan them inside the timed calls.
    settle_gc()
    warm = requests[: BATCH]
    measure(trace, warm, usage)
    per_batch, background, sampled = measure(trace, requests, usage)
    gc.unfreeze()
    return {"shape": shape, "prompt_tokens": tokens, "regime": kind, "requests": count, "sampled": sampled,
            "request_path_us_median": statistics.median(per_batch), "request_path_us_p90": _p90(per_batch),
            "background_us_per_sampled_request": background if sampled else None}


def store_at_bound(folder: Path, bound: int, repeats: int = 20) -> list[dict[str, Any]]:
    """CPU (all threads) per store write once a tenant holds `bound` records, so each write also trims: what the
    background flush pays per tenant and batch."""
    async def run() -> list[dict[str, Any]]:
        worker = await SqliteWorker.open(folder / "bound.sqlite3")
        store = await SqliteTraceStore.open(worker, bound)
        filler = [record_for(float(index)) for index in range(1000)]
        for _ in range(bound // len(filler) + 1):
            await store.write(filler)
        rows = []
        for size in (1, 100):
            batch = [record_for(1e9)] * size
            began = time.process_time_ns()
            for _ in range(repeats):
                await store.write(batch)
            rows.append({"records_held": bound, "batch": size,
                         "ms_per_write": (time.process_time_ns() - began) / repeats / 1e6})
        await worker.close()
        return rows

    return asyncio.run(run())


def record_for(ts: float) -> TraceRecord:
    return TraceRecord(ts=ts, tenant="acme", pool="main", epoch=1, prompt_tokens=1000, cached_tokens=0,
                       completion_tokens=1, text=True, chunk_units=64, tokens_per_chunk=16.0, rate=1.0,
                       chain=b"\x01" * 16 * 16)


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--store-only", action="store_true", help="only the store write at the bound")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        bound = store_at_bound(Path(folder), DEFAULT_MAX_RECORDS)
        for row in bound:
            print(f"store write at the bound ({row['records_held']} records held), {row['batch']:>3}-record batch: "
                  f"{row['ms_per_write']:.3f} ms CPU")
        if args.store_only:
            if args.out:
                args.out.write_text(json.dumps({"store_at_bound": bound}, indent=1))
            return 0
        policy_set = policies(Path(folder) / "policies")
        worker = asyncio.run(SqliteWorker.open(Path(folder) / "state.sqlite3"))
        store = asyncio.run(SqliteTraceStore.open(worker))
        cases: list[tuple[str, int]] = [("text", 1000), ("text", 8000), ("chat", 1000), ("chat", 8000),
                                        ("ids", 1000), ("ids", 8000)]
        for shape, tokens in cases:
            for kind in ("new roots, sampled", "hot roots, sampled", "unsampled"):
                count = args.requests if tokens <= 1000 else max(BATCH * 20, args.requests // 2)
                row = regime(store, policy_set, shape, tokens, kind, count)
                results.append(row)
                _print(row)
        asyncio.run(worker.close())
    if args.out:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        args.out.write_text(json.dumps({"results": results, "store_at_bound": bound, "when": when}, indent=1))
    return 0


def _print(row: dict[str, Any]) -> None:
    per_sampled = row["background_us_per_sampled_request"]
    background = f"{per_sampled:8.1f}" if per_sampled is not None else "       -"
    print(f"{row['shape']:5s} {row['prompt_tokens']:5d} tok  {row['regime']:20s} request path "
          f"{row['request_path_us_median']:6.1f} µs (p90 {row['request_path_us_p90']:6.1f})  "
          f"background {background} µs/sampled request", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
