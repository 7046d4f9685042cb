"""Processes for replaying reuse workloads on loopback (tests and benchmarks): simulators and a gateway started
together, the gateway's reuse trace read back, and the real `kvgate plan` asked about it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from gateway.devtools.loadtest.workloads import ChatWorkload, HotSetWorkload, WorkloadSpec, ZipfWorkload
from gateway.devtools.localproc import ServerProcess, wait_until_ready

BLOCK = 16
GPU_BLOCKS = 256  # 4,096 tokens: small, so that three small workloads overflow it
KV_BYTES_PER_TOKEN = 147456
CHUNK_BYTES = 64 * KV_BYTES_PER_TOKEN
SIM_TIMING = ("--base-ttft-ms", "0", "--prefill-us-per-token", "0", "--cached-us-per-token", "0",
              "--decode-ms-per-token", "0", "--load-us-per-token", "0")

WORKLOADS: dict[str, WorkloadSpec] = {
    "hot": WorkloadSpec(shape=HotSetWorkload(hot_docs=6, doc_tokens=1024, one_off_share=0.5, one_off_tokens=1024,
                                             question_tokens=40), requests=140, seed=11),
    "zipf": WorkloadSpec(shape=ZipfWorkload(docs=40, doc_tokens=512, alpha=1.0, question_tokens=40),
                         requests=140, seed=12),
    "chat": WorkloadSpec(shape=ChatWorkload(system_tokens=256, open_chats=8, turns=8, user_tokens=96,
                                            reply_tokens=64), requests=140, seed=13),
}


def sim_argv(port: int, cpu_bytes: int | None, gpu_blocks: int = GPU_BLOCKS, *extra: str) -> list[str]:
    argv = [sys.executable, "-m", "gateway.sim", "--port", str(port), "--model", "m", "--block-size", str(BLOCK),
            "--gpu-blocks", str(gpu_blocks), "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN), *SIM_TIMING, *extra]
    if cpu_bytes is not None:
        argv += ["--offload", "--cpu-bytes-to-use", str(cpu_bytes)]
    return argv


@contextmanager
def started(commands: dict[str, tuple[list[str], int]], logs: Path, ready_path: str,
            env: dict[str, str] | None = None) -> Iterator[dict[str, ServerProcess]]:
    """Start every process at once, then wait for each to answer `ready_path`."""


    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for name, (argv, port) in commands.items():
            log_path = logs / f"{name}.log"
            with log_path.open("wb") as log:
                popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
            server = ServerProcess(popen=popen, port=port, log_path=log_path)
            stack.callback(server.stop)
            servers[name] = server
        for server in servers.values():
            wait_until_ready(server.popen, f"{server.url}{ready_path}", server.log_path)
        yield servers


def trace_count(state_path: Path, tenant: str) -> int:
    if not state_path.exists():
        return 0
    with sqlite3.connect(state_path) as db:
        try:
            row = db.execute("SELECT COUNT(*) FROM reuse_trace WHERE tenant = ?", (tenant,)).fetchone()
        except sqlite3.OperationalError:  # the table is created when the gateway opens the store
            return 0
    return int(row[0])


def wait_for_trace(state_path: Path, tenant: str, expected: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while trace_count(state_path, tenant) < expected:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the trace of {tenant} has {trace_count(state_path, tenant)} of {expected} records")
        time.sleep(0.1)


def kvgate_plan(state_path: Path, *args: str) -> dict[str, Any]:
    """Run the real `kvgate plan --format json` against the gateway's store."""


    env = {**os.environ, "KVGATE_STATE_PATH": str(state_path), "KVGATE_LOG_FORMAT": "console"}
    done = subprocess.run([sys.executable, "-m", "gateway", "plan", "--format", "json", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"kvgate plan failed ({done.returncode}): {done.stderr}")
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def tier_sizes(knee_bytes: float) -> dict[str, int]:
    """Below, at and above the knee, in whole 64-token chunks."""
    knee_chunks = max(2, round(knee_bytes / CHUNK_BYTES))
    return {"below": max(1, knee_chunks // 2) * CHUNK_BYTES, "at": knee_chunks * CHUNK_BYTES,
            "above": knee_chunks * 2 * CHUNK_BYTES}
