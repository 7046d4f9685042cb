"""How much slower one core runs the same Python work while other cores of the host are busy with it too.

`--workers N` is judged by rps(N) ÷ (N × rps(1)). That ratio also holds what the host does when more of its
cores are busy: a lower clock (turbo headroom shared by the busy cores), shared last-level cache and memory
bandwidth, a hypervisor's scheduling. This benchmark measures that part alone, with no gateway, network or
event loop: a fixed piece of gateway-like Python work (JSON decode and encode, dict and string work, a keyed
hash) is timed on one core while k other cores run the same work in a loop, for each k in `--busy`. The ratio
time(0) ÷ time(k) is the most any N-process server could reach on this host with k + 1 cores busy, whatever its
design.

    python -m loadtests.core_contention --probe-core 0 --other-cores 1-15 --busy 0,1,3,7,15 --out F.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from loadtests.workers_scaling import parse_cores

BODY = json.dumps({"model": "m", "max_tokens": 64, "stream": True, "temperature": 0,
                   "messages": [{"role": "user", "content": "Explain why a per-tenant salt keeps caches apart. " * 8}],
                   "stream_options": {"include_usage": True}}).encode()
KEY = b"k" * 32
ROUNDS_PER_SAMPLE = 20_000  # about 0.1 s of CPU


def work(rounds: int) -> int:
    """Gateway-like work: decode a chat body, edit it, encode it, hash a piece, format a log-like line."""
    total = 0
    for index in range(rounds):
        request = msgspec.json.decode(BODY)
        request["cache_salt"] = hashlib.blake2b(f"tenant:{index}".encode(), key=KEY, digest_size=16).hexdigest()
        request["kv_transfer_params"] = {"max_load_tokens": 4096, "max_offload_tokens": 8192}
        encoded = msgspec.json.encode(request)
        line = f"request_id=r{index} tenant=bench bytes={len(encoded)} status=200"
        total += len(encoded) + len(line) + len(request["messages"][0]["content"].split())
    return total


def burn() -> None:
    """Run `work` until killed (a busy core)."""
    while True:
        work(ROUNDS_PER_SAMPLE)


def probe(samples: int) -> list[float]:
    """CPU seconds per `ROUNDS_PER_SAMPLE` rounds of `work`, `samples` times."""
    times = []
    for _ in range(samples):
        start = time.process_time()
        work(ROUNDS_PER_SAMPLE)
        times.append(time.process_time() - start)
    return times


def pinned_burner(core: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "loadtests.core_contention", "burn"],
                            preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def run_busy(busy_cores: list[int], probe_core: int, samples: int) -> dict[str, Any]:
    burners = [pinned_burner(core) for core in busy_cores]
    try:
        os.sched_setaffinity(0, {probe_core})
        probe(2)  # warm-up, and time for the burners to start (a benchmark's pacing, not a synchronisation)
        times = probe(samples)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    return {"busy_others": len(busy_cores), "seconds_per_sample": statistics.median(times), "samples": times}


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["burn"]:
        burn()
        return 0
    parser = argparse.ArgumentParser(prog="python -m loadtests.core_contention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--probe-core", type=int, default=0)
    parser.add_argument("--other-cores", default="1-15", help="cores that run the same work, in the order used")
    parser.add_argument("--busy", default="0,1,3,7,15", help="how many other cores are busy, per step")
    parser.add_argument("--samples", type=int, default=9)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(args_list)
    others = parse_cores(args.other_cores)
    steps = [int(k) for k in args.busy.split(",")]
    if max(steps) > len(others):
        parser.error(f"--busy {max(steps)} needs that many --other-cores (have {len(others)})")
    rows = [run_busy(others[:k], args.probe_core, args.samples) for k in steps]
    alone = rows[0]["seconds_per_sample"] if steps[0] == 0 else None
    print(f"{'busy cores':>10} {'CPU s per sample':>17} {'speed vs alone':>15}")
    for row in rows:
        row["speed_vs_alone"] = alone / row["seconds_per_sample"] if alone else None
        speed = f"{row['speed_vs_alone']:.3f}" if row["speed_vs_alone"] else "-"
        print(f"{row['busy_others'] + 1:>10} {row['seconds_per_sample']:>17.4f} {speed:>15}")
    if args.out is not None:
        result = {"probe_core": args.probe_core, "other_cores": others, "host_cpus": os.cpu_count(),
                  "rounds_per_sample": ROUNDS_PER_SAMPLE, "rows": rows}
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
