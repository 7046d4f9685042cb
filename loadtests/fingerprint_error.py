"""How well the gateway's prefix fingerprints stand for vLLM's block hashes, measured on the simulator.

For each reuse workload (hot set, Zipf, multi-turn chat) in each prompt format (token ids, text, chat messages),
one simulator with an effectively unbounded GPU prefix cache (nothing is evicted) and KV events serves the
workload through a real gateway, one request at a time. Then:

- per request, the prefix the *server* found already cached — `cached_tokens` from usage, i.e. vLLM's own
  block-hash lookup — against the prefix the *fingerprints* say was seen before (leading fingerprints already
  in the trace × tokens per chunk, capped like vLLM at the last whole block before the final token);
- in total, the distinct prefix tokens the server stored — block hashes of every GPU `BlockStored` KV event,
  read back from the simulator's replay endpoint, × block size — against distinct fingerprints × tokens per
  chunk.

Errors are reported as shares of all prompt tokens: mean absolute error, bias (positive: fingerprints see more
reuse than the server), the largest single-request error in tokens, and the relative error of the distinct
total. The simulator's tokenizer is byte-level (one token per UTF-8 byte), so text prompts here have an exactly
constant characters-per-token ratio; a BPE tokenizer's varying ratio adds boundary drift not measured here.

    .venv/bin/python -m loadtests.fingerprint_error [--requests 120] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import zmq

from gateway.devtools.loadtest.workload_run import WorkloadResult, WorkloadTarget, run_workload
from gateway.devtools.loadtest.workload_stack import BLOCK, WORKLOADS, sim_argv, started, wait_for_trace
from gateway.devtools.localproc import free_port, free_port_pair, kvgate_command
from gateway.kvevents.wire import BatchDecoder, BlockStored, open_envelope, replay_request
from gateway.reuse.record import TraceRecord, decode_record
from tests.harness import PolicyDir, new_secret

FORMATS = ("tokens", "text", "chat")
UNBOUNDED_BLOCKS = 400_000


def read_trace(state: Path, tenant: str) -> list[TraceRecord]:
    with sqlite3.connect(state) as db:
        rows = db.execute("SELECT record FROM reuse_trace WHERE tenant = ? ORDER BY id", (tenant,)).fetchall()
    return [decode_record(row[0]) for row in rows]


def stored_blocks(replay_endpoint: str, timeout_s: float = 30.0) -> set[int | bytes]:
    """Every GPU block hash the server announced, from its replay endpoint (batches from 0 to the end)."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay_endpoint)
    decoder = BatchDecoder()
    hashes: set[int | bytes] = set()
    try:
        dealer.send_multipart(replay_request(0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not dealer.poll(int((deadline - time.monotonic()) * 1000)):
                break
            frames = dealer.recv_multipart()
            envelope = open_envelope(frames)
            if not envelope.payload:
                return hashes
            for event in decoder.decode(envelope.payload).events:
                if isinstance(event, BlockStored) and (event.medium or "GPU") == "GPU":
                    hashes.update(event.block_hashes)
    finally:
        dealer.close(linger=0)
        context.term()
    raise TimeoutError("the replay did not end")


def compare(trace: list[TraceRecord], result: WorkloadResult, blocks: set[int | bytes]) -> dict[str, Any]:
    if len(trace) != len(result.per_request):
        raise RuntimeError(f"{len(trace)} trace records for {len(result.per_request)} answers")
    seen: set[bytes] = set()
    abs_error = signed = worst = 0.0
    total_prompt = 0
    distinct_fp_tokens = 0.0
    for record, (prompt, cached) in zip(trace, result.per_request, strict=True):
        chain = record.fingerprint_list()
        matched = 0
        for fingerprint in chain:
            if fingerprint not in seen:
                break
            matched += 1
        predicted = min(matched * record.tokens_per_chunk, (prompt - 1) // BLOCK * BLOCK)
        error = predicted - cached
        abs_error += abs(error)
        signed += error
        worst = max(worst, abs(error))
        total_prompt += prompt
        for fingerprint in chain:
            if fingerprint not in seen:
                seen.add(fingerprint)
                distinct_fp_tokens += record.tokens_per_chunk
    server_tokens = len(blocks) * BLOCK
    return {"requests": len(trace), "prompt_tokens": total_prompt,
            "server_cached_share": sum(c for _, c in result.per_request) / total_prompt,
            "mean_abs_error_share": abs_error / total_prompt, "bias_share": signed / total_prompt,
            "max_request_error_tokens": worst, "server_distinct_tokens": server_tokens,
            "fingerprint_distinct_tokens": distinct_fp_tokens,
            "distinct_relative_error": (distinct_fp_tokens - server_tokens) / server_tokens if server_tokens else None}


def run(requests: int) -> list[dict[str, Any]]:
    names = [f"{workload}-{fmt}" for workload in WORKLOADS for fmt in FORMATS]
    sims = {name: (free_port(), free_port_pair()) for name in names}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        policies = PolicyDir(root / "policies", {n: {"upstreams": [f"http://127.0.0.1:{p}"]} for n, (p, _) in
                                                 sims.items()})
        for name in names:
            policies.add_tenant(name, rollout={"pool": name})
        policies.write()
        state, port = root / "state.sqlite3", free_port()
        env = {"KVGATE_SALT_SECRET": new_secret(), "KVGATE_STATE_PATH": str(state), "KVGATE_LOG_LEVEL": "warning"}
        commands = {name: (sim_argv(port_, None, UNBOUNDED_BLOCKS, "--kv-events-endpoint", f"tcp://*:{events}",
                                    "--kv-events-replay-endpoint", f"tcp://*:{events + 1}"), port_)
                    for name, (port_, events) in sims.items()}
        gateway_argv = kvgate_command("serve", "--policies", str(policies.root), "--port", str(port))
        with started(commands, root, "/health") as servers, \
                started({"gateway": (gateway_argv, port)}, root, "/livez", env) as gateway:
            results = asyncio.run(_drive(gateway["gateway"].url, policies.keys,
                                         {n: s.url for n, s in servers.items()}, names, requests))
            rows = []
            for name in names:
                wait_for_trace(state, name, requests)
                blocks = stored_blocks(f"tcp://127.0.0.1:{sims[name][1] + 1}")
                row = {"workload": name.split("-")[0], "format": name.split("-")[1],
                       **compare(read_trace(state, name), results[name], blocks)}
                rows.append(row)
                _print(row)
    return rows


async def _drive(gateway: str, keys: dict[str, str], sims: dict[str, str], names: list[str],
                 requests: int) -> dict[str, WorkloadResult]:
    async with httpx.AsyncClient(timeout=120.0) as http:
        async def one(name: str) -> WorkloadResult:
            workload, fmt = name.split("-")
            spec = WORKLOADS[workload].model_copy(update={"format": fmt, "requests": requests})
            return await run_workload(http, WorkloadTarget(gateway, keys[name], "m", 1, f"{sims[name]}/metrics"), spec)

        results = await asyncio.gather(*[one(name) for name in names])
    return dict(zip(names, results, strict=True))


def _print(row: dict[str, Any]) -> None:
    print(f"{row['workload']:5s} {row['format']:6s} cached {row['server_cached_share']:6.1%}  "
          f"MAE {row['mean_abs_error_share']:6.2%}  bias {row['bias_share']:+6.2%}  "
          f"worst {row['max_request_error_tokens']:5.0f} tok  distinct {row['distinct_relative_error']:+6.2%}",
          flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = run(args.requests)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                       indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
