"""Ledger audit at scale (issue 12): how long `/admin/audit`'s report takes over N block records, whether it
stalls the event loop, whether it waits behind ingestion or compaction, and how fast events go into a ledger
that size. Not a test.

Builds a SQLite ledger of `--records` block records through the store's own write path (batches of OpenOp /
CloseOp as the writer sends them; 4 tenants, GPU and CPU, two epochs, stored over the last `--days` days,
all but `--open-share` of them closed, with lifetimes of 1 s to 3 h), or reuses one built before
(`--ledger PATH`: built there when missing, then only ever copied, so one slow build serves every run). On
a copy of it, in phases, it times `collect_audit` (what `/admin/audit` runs after its flush) `--audits`
times in a row while a ticker on the same event loop measures how late it wakes (the stall a request would
see):

1. quiet: nothing else running;
2. ingesting: a writer applies vLLM-shaped batches (random 64-bit hashes, stored now, half of them removed)
   as fast as it can, and the events/s per core of that ingestion into the big table is reported;
3. compacting: closed records past the default horizon (7 days) are deleted meanwhile;
4. after compaction.

Prints a table and writes JSON. Figures from a shared machine are noisy: say so.

    .venv/bin/python -m loadtests.ledger_scale --records 10000000 --ledger /tmp/kvgate-ledger-10m.sqlite3 \\
        --out /tmp/ledger-scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore
from gateway.ledger.config import MIN_COMPACT_AFTER_S
from gateway.ledger.records import BatchOps, CloseOp, Op, OpenOp
from gateway.ledger.sqlite_store import SqliteStore
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.tasks import TaskSupervisor
from loadtests.results import write_json

TENANTS = ("acme", "globex", "initech", "unattributed")
SOURCES = ("offload/0", "control/0")
RECORDS_PER_BATCH = 25_000  # build batches: this many opens and the closes among them
LIVE_BLOCKS_PER_BATCH = 2_000  # ingestion phase: opens per batch, and as many removals of earlier ones
TICK_S = 0.005


@dataclass
class Timing:
    label: str
    calls: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    loop_lag_max_ms: float

    def line(self) -> str:
        return (f"{self.label:34s} {self.calls:4d} calls  p50 {self.p50_ms:8.1f} ms  p99 {self.p99_ms:8.1f} ms  "
                f"max {self.max_ms:8.1f} ms  event-loop lag max {self.loop_lag_max_ms:6.1f} ms")


def _build_batches(records: int, days: float, open_share: float, now: float, seed: int) -> Iterator[BatchOps]:
    """Chunks in storage order: each chunk's opens, then the closes among them (a ledger's history)."""
    rng = random.Random(seed)
    for seq, start in enumerate(range(0, records, RECORDS_PER_BATCH)):
        opens: list[Op] = []
        closes: list[Op] = []
        for index in range(start, min(records, start + RECORDS_PER_BATCH)):
            stored_at = now - rng.random() * days * 86_400
            tenant = TENANTS[index % len(TENANTS)]
            medium = "GPU" if index % 3 else "CPU"
            epoch = None if tenant == "unattributed" else 1 + (index % 7 == 0)
            block = rng.getrandbits(64)
            opens.append(OpenOp(medium, block, None, tenant, epoch, stored_at))
            if rng.random() >= open_share:
                closes.append(CloseOp(medium, block, min(now, stored_at + rng.uniform(1, 10_800))))
        yield BatchOps(SOURCES[0], seq, float(seq), "bench", opens + closes)


async def build(path: Path, records: int, days: float, open_share: float) -> dict[str, Any]:
    store = await SqliteStore.open(path)
    now = time.time()
    ops = 0
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        for number, batch in enumerate(_build_batches(records, days, open_share, now, seed=12)):
            await store.apply([batch])
            ops += len(batch.ops)
            if number % 40 == 0:
                print(f"  built {(number + 1) * RECORDS_PER_BATCH:,} records, "
                      f"{ops / (time.process_time() - cpu):,.0f} ops per CPU-second so far", flush=True)
    finally:
        await store.close()
    elapsed, used = time.perf_counter() - wall, time.process_time() - cpu
    return {"records": records, "open_share": open_share, "built_at": now, "ops": ops, "wall_s": round(elapsed, 1),
            "cpu_s": round(used, 1), "ops_per_cpu_s": round(ops / used)}


async def time_audits(label: str, store: LedgerStore, policies: PolicySet, calls: int) -> Timing:
    """`collect_audit` (what `/admin/audit` runs) `calls` times in a row, with a ticker on the same loop."""
    lag = [0.0]
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            expected = time.perf_counter() + TICK_S
            await asyncio.sleep(TICK_S)
            lag[0] = max(lag[0], time.perf_counter() - expected)

    tasks = TaskSupervisor("ledger-scale")
    tasks.spawn(ticker(), "loop-lag-probe")
    durations = []
    for _call in range(calls):
        start = time.perf_counter()
        await collect_audit(store, policies, None, None)
        durations.append(time.perf_counter() - start)
    stop.set()
    await tasks.drain()
    durations.sort()
    return Timing(label, calls, 1000 * durations[len(durations) // 2],
                  1000 * durations[min(len(durations) - 1, int(0.99 * len(durations)))], 1000 * durations[-1],
                  1000 * lag[0])


@dataclass
class Ingestion:
    block_events: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0

    def view(self) -> dict[str, Any]:
        return {"block_events": self.block_events, "wall_s": round(self.seconds, 1), "cpu_s": round(self.cpu_s, 1),
                "events_per_cpu_s": round(self.block_events / self.cpu_s) if self.cpu_s else None}


async def ingest_until(store: SqliteStore, stop: asyncio.Event, result: Ingestion, seed: int) -> None:
    """vLLM-shaped live traffic: each batch stores LIVE_BLOCKS_PER_BATCH new blocks now and removes those of
    the batch before (GPU evictions), like the captures; per core = this process's CPU time."""
    rng = random.Random(seed)
    previous: list[int] = []
    seq = 1_000_000_000 + rng.getrandbits(32)
    wall, cpu = time.perf_counter(), time.process_time()
    while not stop.is_set():
        now = time.time()
        blocks = [rng.getrandbits(64) for _ in range(LIVE_BLOCKS_PER_BATCH)]
        ops: list[Op] = [OpenOp("GPU", block, None, TENANTS[block % 3], 1, now) for block in blocks]
        ops += [CloseOp("GPU", block, now) for block in previous]
        await store.apply([BatchOps(SOURCES[1], seq, now, "bench", ops)])
        result.block_events += len(ops)
        previous, seq = blocks, seq + 1
    result.seconds, result.cpu_s = time.perf_counter() - wall, time.process_time() - cpu


async def run_phases(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    policies = load_policy_set(args.policies)
    store = await SqliteStore.open(path)
    result: dict[str, Any] = {}
    timings: list[Timing] = []
    tasks = TaskSupervisor("ledger-scale-load")
    try:
        timings.append(await time_audits("audit, quiet", store, policies, args.audits))
        print(timings[-1].line(), flush=True)

        stop, ingestion = asyncio.Event(), Ingestion()
        tasks.spawn(ingest_until(store, stop, ingestion, seed=5), "ingest")
        timings.append(await time_audits("audit while ingesting", store, policies, args.audits))
        stop.set()
        await tasks.drain()
        result["ingestion_during_audits"] = ingestion.view()
        print(timings[-1].line(), f"(ingestion meanwhile: {ingestion.view()})", flush=True)

        stop, ingestion = asyncio.Event(), Ingestion()
        tasks.spawn(ingest_until(store, stop, ingestion, seed=6), "ingest")
        await asyncio.sleep(args.ingest_s)  # the ingestion runs this long on its own, measured alone
        stop.set()
        await tasks.drain()
        result["ingestion_alone"] = ingestion.view()
        print(f"ingestion alone into the big ledger: {ingestion.view()}", flush=True)

        started = time.perf_counter()
        compaction = tasks.spawn(store.compact(time.time() - MIN_COMPACT_AFTER_S), "compact")
        timings.append(await time_audits("audit while compacting", store, policies, args.audits))
        deleted = await compaction
        result["compaction"] = {"deleted": deleted, "seconds": round(time.perf_counter() - started, 1)}
        print(f"compaction: {result['compaction']}", flush=True)
        timings.append(await time_audits("audit after compaction", store, policies, args.audits))
        print(timings[-1].line(), flush=True)
    finally:
        await tasks.close()
        await store.close()
    result["timings"] = [asdict(timing) for timing in timings]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=10.0, help="stored_at spread over this many days")
    parser.add_argument("--open-share", type=float, default=0.05,
                        help="records still open (resident) at the end of the build")
    parser.add_argument("--ledger", type=Path,
                        help="a built ledger to reuse (built there first when missing); runs use a copy of it")
    parser.add_argument("--audits", type=int, default=100)
    parser.add_argument("--ingest-s", type=float, default=20.0, help="the ingestion-alone phase")
    parser.add_argument("--policies", type=Path, default=Path("policies"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-ledger-scale-"))
    result: dict[str, Any] = {"records": args.records, "days": args.days}
    try:
        source = args.ledger or workdir / "built.sqlite3"
        if not source.exists():
            result["build"] = asyncio.run(build(source, args.records, args.days, args.open_share))
            print(f"built {args.records:,} records: {result['build']}", flush=True)
        copy = workdir / "ledger.sqlite3"
        shutil.copyfile(source, copy)
        result.update(asyncio.run(run_phases(args, copy)))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out is not None:
        write_json(result, args.out)


if __name__ == "__main__":
    main()
