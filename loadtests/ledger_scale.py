"""Ledger audit at scale (issue 12): how long `/admin/audit`'s report takes over N block records, whether it
stalls the event loop, and what compaction does. Not a test.

Builds a SQLite ledger of `--records` block records through the store's own write path (batches of OpenOp /
CloseOp as the writer sends them; 4 tenants, GPU and CPU, two epochs, two sources, stored over the last
`--days` days, about half closed with lifetimes of 1 s to 3 h), then times `collect_audit` — what
`/admin/audit` runs after its flush — `--audits` times in a row, while a ticker on the same event loop
measures how late it wakes (the stall a request would see). Then it compacts closed records older than the
default horizon (7 days) and times the audit again, and times one windowed (`--since` 1 h) audit, which
reads records. Prints a table and writes JSON.

    .venv/bin/python -m loadtests.ledger_scale --records 10000000 --out /tmp/ledger-scale.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.ledger.audit import collect_audit
from gateway.ledger.config import MIN_COMPACT_AFTER_S
from gateway.ledger.records import BatchOps, CloseOp, Op, OpenOp
from gateway.ledger.sqlite_store import SqliteStore
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.tasks import TaskSupervisor

TENANTS = ("acme", "globex", "initech", "unattributed")
SOURCES = ("offload/0", "control/0")
OPS_PER_BATCH = 50_000
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


def _batches(records: int, days: float, now: float, seed: int) -> list[BatchOps]:
    rng = random.Random(seed)
    opens: list[Op] = []
    closes: list[Op] = []
    for index in range(records):
        stored_at = now - rng.random() * days * 86_400
        tenant = TENANTS[index % len(TENANTS)]
        medium = "GPU" if index % 3 else "CPU"
        epoch = None if tenant == "unattributed" else 1 + (index % 7 == 0)
        opens.append(OpenOp(medium, index, None, tenant, epoch, stored_at))
        if rng.random() < 0.5:
            closes.append(CloseOp(medium, index, min(now, stored_at + rng.uniform(1, 10_800))))
    ops = opens + closes
    return [BatchOps(SOURCES[0], start // OPS_PER_BATCH, float(start), "bench",
                     ops[start : start + OPS_PER_BATCH]) for start in range(0, len(ops), OPS_PER_BATCH)]


async def build(store: SqliteStore, records: int, days: float, now: float) -> dict[str, float]:
    batches = _batches(records, days, now, seed=12)
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        await store.apply([batch])
    ops = sum(len(batch.ops) for batch in batches)
    elapsed, used = time.perf_counter() - wall, time.process_time() - cpu
    return {"records": records, "ops": ops, "wall_s": round(elapsed, 1), "cpu_s": round(used, 1),
            "ops_per_cpu_s": round(ops / used)}


async def time_audits(label: str, store: SqliteStore, policies: PolicySet, calls: int,
                      since: datetime | None = None) -> Timing:
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
        await collect_audit(store, policies, None, since)
        durations.append(time.perf_counter() - start)
    stop.set()
    await tasks.drain()
    durations.sort()
    return Timing(label, calls, 1000 * durations[len(durations) // 2],
                  1000 * durations[min(len(durations) - 1, int(0.99 * len(durations)))], 1000 * durations[-1],
                  1000 * lag[0])


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    policies = load_policy_set(args.policies)
    store = await SqliteStore.open(workdir / "ledger.sqlite3")
    now = time.time()
    result: dict[str, Any] = {"records": args.records, "days": args.days}
    try:
        result["build"] = await build(store, args.records, args.days, now)
        print(f"built {args.records:,} records: {result['build']}", flush=True)
        timings = [await time_audits("audit (all tenants)", store, policies, args.audits)]
        print(timings[-1].line(), flush=True)
        started = time.perf_counter()
        deleted = await store.compact(time.time() - MIN_COMPACT_AFTER_S)
        result["compaction"] = {"deleted": deleted, "seconds": round(time.perf_counter() - started, 1),
                                "left": len(await store.open_blocks())}
        print(f"compaction: {result['compaction']}", flush=True)
        timings.append(await time_audits("audit after compaction", store, policies, args.audits))
        print(timings[-1].line(), flush=True)
        if args.windowed_audits:  # reads every open record and those closed since: the path that does not scale
            since = datetime.fromtimestamp(now - 3600, UTC)
            timings.append(await time_audits("windowed audit (--since 1 h)", store, policies, args.windowed_audits,
                                             since))
            print(timings[-1].line(), flush=True)
        result["timings"] = [asdict(timing) for timing in timings]
    finally:
        await store.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--days", type=float, default=10.0, help="stored_at spread over this many days")
    parser.add_argument("--audits", type=int, default=100)
    parser.add_argument("--windowed-audits", type=int, default=3, help="0 skips them (they hold every open record)")
    parser.add_argument("--policies", type=Path, default=Path("policies"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-ledger-scale-"))
    try:
        result = asyncio.run(run(args, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
