"""The Redis ledger store at scale (issue 12): ingestion, memory per record, and `/admin/audit`'s report time
over a ledger fed `--records` block records. Not a test.

It starts its own `redis-server` (no persistence, a free loopback port) and feeds the Redis store a
chronological stream through its own write path: `--records` blocks stored evenly over the last `--days` days
(4 tenants, GPU and CPU, two epochs), each removed 1 s - 3 h later except one in 50 (still resident at the end:
age violations), opens and removals in time order in batches of 5,000 operations, and compaction with the
default horizon (7 days) once per simulated day, as the gateway's compaction loop runs it, so the records kept
one by one are those of the last week. It reports ingestion (block operations per second of wall time, and per
CPU second of this process plus redis-server), Redis memory per record kept, then times `collect_audit` `--audits`
times in a row while a 5 ms ticker on the same event loop records how late it wakes, and reads from Redis's slow
log (every command logged meanwhile) how long Redis itself was busy per audit and its longest single command.
Prints and writes JSON.

    .venv/bin/python -m loadtests.ledger_scale_redis --records 10000000 --days 60 --out /tmp/ledger-scale-redis.json
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import heapq
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import redis

from gateway.devtools.localproc import free_port
from gateway.ledger.config import MIN_COMPACT_AFTER_S
from gateway.ledger.records import BatchOps, CloseOp, Op, OpenOp
from gateway.ledger.redis_store import RedisStore
from gateway.policy.loader import load_policy_set
from loadtests.ledger_scale import SOURCES, TENANTS, time_audits
from loadtests.results import write_json

STREAM_BATCH_OPS = 5_000
RESIDENT_EVERY = 50  # one block in this many is never removed


def _stream(records: int, days: float, now: float, seed: int) -> Iterator[tuple[float, list[Op]]]:
    """(simulated time, operations) in time order: each block opened at its stored_at, removed at its
    removed_at, both in the batch covering that time."""
    rng = random.Random(seed)
    start, step = now - days * 86_400, days * 86_400 / records
    removals: list[tuple[float, int, str]] = []
    ops: list[Op] = []
    for index in range(records):
        stored_at = start + index * step
        while removals and removals[0][0] <= stored_at:
            removed_at, block, medium = heapq.heappop(removals)
            ops.append(CloseOp(medium, block, removed_at))
        tenant = TENANTS[index % len(TENANTS)]
        medium = "GPU" if index % 3 else "CPU"
        epoch = None if tenant == "unattributed" else 1 + (index % 7 == 0)
        ops.append(OpenOp(medium, index, None, tenant, epoch, stored_at))
        if index % RESIDENT_EVERY:
            heapq.heappush(removals, (min(now, stored_at + rng.uniform(1, 10_800)), index, medium))
        if len(ops) >= STREAM_BATCH_OPS:
            yield stored_at, ops
            ops = []
    ops.extend(CloseOp(medium, block, removed_at) for removed_at, block, medium in sorted(removals))
    yield now, ops


def _info(client: redis.Redis, section: str) -> dict[str, Any]:
    info: dict[str, Any] = client.info(section)  # type: ignore[assignment]
    return info


def _redis_cpu(client: redis.Redis) -> float:
    info = _info(client, "cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


async def build_redis(store: RedisStore, admin: redis.Redis, records: int, days: float, now: float) -> dict[str, Any]:
    horizon = MIN_COMPACT_AFTER_S
    wall, cpu, redis_cpu = time.perf_counter(), time.process_time(), _redis_cpu(admin)
    ops = compacted = 0
    compaction_s = 0.0
    next_compaction = now - days * 86_400 + 86_400
    peak_memory = 0
    for seq, (sim_time, batch) in enumerate(_stream(records, days, now, seed=12)):
        await store.apply([BatchOps(SOURCES[0], seq, float(seq), "bench", batch)])
        ops += len(batch)
        if sim_time >= next_compaction:
            started = time.perf_counter()
            compacted += await store.compact(sim_time - horizon)
            compaction_s += time.perf_counter() - started
            next_compaction += 86_400
            peak_memory = max(peak_memory, int(_info(admin, "memory")["used_memory"]))
        if seq % 400 == 399:
            print(f"  {ops:,} operations, {time.perf_counter() - wall:.0f} s", flush=True)
    elapsed, used = time.perf_counter() - wall, time.process_time() - cpu
    server = _redis_cpu(admin) - redis_cpu
    return {"records": records, "ops": ops, "wall_s": round(elapsed, 1), "cpu_s_client": round(used, 1),
            "cpu_s_redis": round(server, 1), "ops_per_wall_s": round(ops / elapsed),
            "ops_per_cpu_s": round(ops / (used + server)), "compacted_during_build": compacted,
            "compaction_s": round(compaction_s, 1), "peak_used_memory_mb": round(peak_memory / 2**20, 1)}


def redis_memory(admin: redis.Redis, prefix: str) -> dict[str, Any]:
    kept = int(admin.hlen(prefix + "rec"))  # type: ignore[arg-type]
    used = int(_info(admin, "memory")["used_memory"])
    return {"records_kept": kept, "used_memory_mb": round(used / 2**20, 1),
            "bytes_per_record_kept": round(used / kept) if kept else None}


@contextmanager
def redis_server(workdir: Path) -> Iterator[int]:
    """A redis-server of this run's own (no persistence), stopped by PID on the way out; yields its port."""
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--dir", str(workdir)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        admin = redis.Redis(port=port)
        deadline = time.monotonic() + 20
        while True:
            try:
                admin.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # polling while redis-server binds
        admin.close()
        yield port
    finally:
        server.terminate()
        server.wait(timeout=30)


SCRIPT_CLIENT = b"?:0"  # the slow log's client address for a command a script ran (its time is the script's too)


class RedisHold:
    """What Redis itself spent on the audits, from its slow log with every command logged: the total of the
    commands clients sent (a script's own commands are inside its time), the longest of them (the longest any
    other client of that Redis, such as the rate limiter, could wait), and every command by name, scripts'
    commands included."""

    def __init__(self) -> None:
        self.durations_us: list[int] = []
        self.by_command: collections.Counter[str] = collections.Counter()

    def per_audit(self, audits: int) -> dict[str, Any]:
        return {"commands_sent": round(len(self.durations_us) / audits, 1),
                "by_command": {name: round(count / audits, 1) for name, count in self.by_command.most_common()},
                "busy_ms": round(sum(self.durations_us) / audits / 1000, 3),
                "longest_command_ms": round(max(self.durations_us, default=0) / 1000, 3)}


@contextmanager
def redis_hold(admin: redis.Redis) -> Iterator[RedisHold]:
    hold = RedisHold()
    admin.config_set("slowlog-log-slower-than", 0)
    admin.config_set("slowlog-max-len", 1_000_000)
    admin.slowlog_reset()
    try:
        yield hold
    finally:
        entries: list[dict[str, Any]] = admin.slowlog_get(1_000_000)  # type: ignore[assignment]
        kept = [entry for entry in entries if _command(entry) not in ("slowlog", "config")]
        hold.durations_us = [int(entry["duration"]) for entry in kept if entry.get("client_address") != SCRIPT_CLIENT]
        hold.by_command = collections.Counter(_command(entry) for entry in kept)
        admin.config_set("slowlog-log-slower-than", 10_000)


def _command(entry: dict[str, Any]) -> str:
    command = entry.get("command", b"")
    text = command.decode(errors="replace") if isinstance(command, bytes) else str(command)
    return text.split(" ", 1)[0].lower()


async def run_redis(args: argparse.Namespace, port: int) -> dict[str, Any]:
    policies = load_policy_set(args.policies)
    admin = redis.Redis(port=port)
    result: dict[str, Any] = {"backend": "redis", "records": args.records, "days": args.days}
    baseline = int(_info(admin, "memory")["used_memory"])
    prefix = "kvgate:ledger:"
    store = await RedisStore.open(f"redis://127.0.0.1:{port}/0", prefix=prefix, timeout_s=30.0)
    now = time.time()
    try:
        result["build"] = await build_redis(store, admin, args.records, args.days, now)
        print(f"built: {result['build']}", flush=True)
        result["memory"] = redis_memory(admin, prefix) | {"empty_used_memory_mb": round(baseline / 2**20, 1)}
        print(f"memory: {result['memory']}", flush=True)
        with redis_hold(admin) as hold:
            timings = [await time_audits("audit (all tenants)", store, policies, args.audits)]
        print(timings[-1].line(), flush=True)
        result["timings"] = [asdict(timing) for timing in timings]
        result["redis_per_audit"] = hold.per_audit(args.audits)
        print(f"redis per audit: {result['redis_per_audit']}", flush=True)
    finally:
        await store.close()
        admin.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=60.0, help="stored_at spread over this many days")
    parser.add_argument("--audits", type=int, default=100)
    parser.add_argument("--policies", type=Path, default=Path("policies"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-ledger-scale-redis-"))
    try:
        with redis_server(workdir) as port:
            result = asyncio.run(run_redis(args, port))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out is not None:
        write_json(result, args.out)


if __name__ == "__main__":
    main()
