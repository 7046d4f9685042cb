"""Closed-loop streaming load from wrk (C, epoll): a load generator that costs a small fraction of the proxy's CPU.

The Python generators (`loadtests.loadgen`, aiohttp) spend about as much CPU per streamed answer as the gateway
does, so on a 16-core host the bench runs out of cores before eight gateway workers do (the `--workers` runs
of 2026-12-01: at N = 8 the upstreams and generators were 87-100 % busy). wrk read a 16-token streamed answer
for about 0.04 ms of CPU on the device host (0.78 of a core at 19,400 answers/s). It does not time the first
event (no TTFT): it reports completed answers, errors and the latency of whole answers.

Each wrk thread cycles through the request bodies (one per line of `bodies`), starting at a random one, so the
gateway's prefix affinity spreads the load over every upstream of the pool. The key travels in the environment,
never on a command line.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SCRIPT = """\
-- Written by loadtests/wrk_load.py: POST each body of KVGATE_WRK_BODIES in turn, print a JSON summary.
local path = os.getenv("KVGATE_WRK_BODIES")
local key = os.getenv("KVGATE_WRK_KEY")
local prepared = {}
local next_index = 0

function init(args)
  local headers = {["content-type"] = "application/json", ["authorization"] = "Bearer " .. key}
  for line in io.lines(path) do
    prepared[#prepared + 1] = wrk.format("POST", nil, headers, line)
  end
  next_index = math.random(#prepared)
end

function request()
  next_index = next_index % #prepared + 1
  return prepared[next_index]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %d, "duration_us": %d, "connect": %d, "read": %d, "write": %d, "status": %d, ' ..
    '"timeout": %d, "p50_us": %d, "p99_us": %d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
"""


@dataclass(frozen=True)
class WrkResult:
    completed: int
    errors: int  # connect, read, write and timeout errors, and answers with a status of 400 or more
    window_s: float
    answer_p50_ms: float  # whole answers, request sent to last byte
    answer_p99_ms: float
    cpu_s: float  # wrk's own CPU over its run (its rusage once reaped)


def wrk_binary() -> str:
    """The wrk to run: $KVGATE_WRK, or `wrk` on PATH."""
    binary = os.environ.get("KVGATE_WRK") or shutil.which("wrk")
    if binary is None:
        raise SystemExit("--generator wrk needs wrk on PATH or in $KVGATE_WRK (apt install wrk)")
    return binary


def write_script(work: Path) -> Path:
    script = work / "kvgate-load.lua"
    script.write_text(SCRIPT)
    return script


@dataclass(frozen=True)
class WrkRun:
    url: str
    key: str
    bodies: Path
    connections: int
    threads: int
    duration_s: float


def start(run: WrkRun, script: Path, cores: Iterable[int]) -> subprocess.Popen[bytes]:
    argv = [wrk_binary(), "-t", str(run.threads), "-c", str(max(run.connections, run.threads)),
            "-d", f"{run.duration_s:g}s", "--timeout", "30s", "-s", str(script), run.url]
    env = {**os.environ, "KVGATE_WRK_BODIES": str(run.bodies), "KVGATE_WRK_KEY": run.key}
    mask = set(cores)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: os.sched_setaffinity(0, mask))


def finish(process: subprocess.Popen[bytes], timeout_s: float) -> WrkResult:
    """Wait for one wrk started by `start`, and read its summary. Call for one wrk at a time: its CPU is the rise
    in this process's reaped children's rusage across the wait."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out, err = process.communicate(timeout=timeout_s)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed with status {process.returncode}: {err.decode(errors='replace')[-2000:]}")
    summary = json.loads(out.decode().strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    errors = sum(summary[name] for name in ("connect", "read", "write", "status", "timeout"))
    return WrkResult(summary["requests"], errors, summary["duration_us"] / 1e6, summary["p50_us"] / 1000,
                     summary["p99_us"] / 1000, cpu)
