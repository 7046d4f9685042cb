"""Ledger ingestion throughput: block events per second per core, into SQLite and into Redis.

Not a test. Feeds vLLM-shaped msgpack batches (an 8000-token prefill = one 500-hash GPU BlockStored, its
125 CPU placeholders, and 500 single-hash GPU BlockRemoved evictions of an earlier prompt, as the captures
show) through the same path a subscriber uses after the socket: decode -> attribution and lifecycle ->
batched store writes. "Per core" divides by this process's CPU time (the SQLite writer thread included);
Redis's own CPU time is reported beside it. Run: .venv/bin/python loadtests/ingest_bench.py [--batches N]
[--ledger BIG.sqlite3] (SQLite into a copy of a big ledger, e.g. 10M records built by loadtests/ledger_scale.py)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec
import redis

from gateway.devtools.localproc import free_port
from gateway.kvevents.wire import BatchDecoder
from gateway.ledger.attribution import KnownHashes
from gateway.ledger.base import LedgerStore
from gateway.ledger.lifecycle import LedgerState
from gateway.ledger.records import BatchOps, SaltDigestEntry
from gateway.ledger.redis_store import RedisStore
from gateway.ledger.salts import DigestLru, SaltIndex, salt_digest
from gateway.ledger.sqlite_store import SqliteStore
from gateway.ledger.writer import BatchWriter
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.tasks import TaskSupervisor

BLOCKS_PER_PROMPT = 500
TENANTS = ("acme", "globex", "initech")


@dataclass
class Result:
    backend: str
    block_events: int
    wall_s: float
    cpu_s: float
    redis_cpu_s: float = 0.0

    def line(self) -> str:
        per_core = self.block_events / self.cpu_s
        extra = f", redis-server CPU {self.redis_cpu_s:.2f} s" if self.redis_cpu_s else ""
        return (f"{self.backend:7s} {self.block_events:>9,d} block events in {self.wall_s:6.2f} s wall "
                f"({self.block_events / self.wall_s:>9,.0f}/s), {self.cpu_s:6.2f} s CPU -> "
                f"{per_core:>9,.0f} block events/s per core{extra}")


def make_payloads(batches: int) -> tuple[list[bytes], int]:
    rng = random.Random(7)
    payloads: list[bytes] = []
    previous: list[int] = []
    total = 0
    for index in range(batches):
        chain = [rng.getrandbits(64) for _ in range(BLOCKS_PER_PROMPT)]
        salt = f"salt-{TENANTS[index % len(TENANTS)]}"
        events = [_stored(chain, salt)] + [_placeholder(block) for block in chain[3::4]]
        events += [{"type": "BlockRemoved", "block_hashes": [block], "medium": "GPU", "group_idx": 0}
                   for block in previous]
        total += len(chain) + len(chain[3::4]) + len(previous)
        payloads.append(msgspec.msgpack.encode([1_800_000_000.0 + index, events, 0]))
        previous = chain
    return payloads, total


def _stored(chain: list[int], salt: str) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": chain, "parent_block_hash": None,
            "token_ids": [1] * 16 * len(chain), "block_size": 16, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [[salt]] + [None] * (len(chain) - 1), "group_idx": 0,
            "kv_cache_spec_kind": "full_attention"}


def _placeholder(block: int) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": [block], "parent_block_hash": None, "token_ids": [],
            "block_size": 0, "lora_id": None, "medium": "CPU", "lora_name": None, "group_idx": 0}


def salt_index(policies: PolicySet) -> SaltIndex:
    index = SaltIndex.build(policies, None, DigestLru(len(TENANTS) + 1_000))
    index.add_users(SaltDigestEntry(tenant, 0, salt_digest(f"salt-{tenant}")) for tenant in TENANTS)
    return index


async def ingest(store: LedgerStore, payloads: list[bytes], policies: PolicySet) -> None:
    decoder, state = BatchDecoder(), LedgerState(salt_index(policies), KnownHashes())
    applied: list[BatchOps] = []
    writer = BatchWriter(store, 400_000, applied.append, applied.append)
    tasks = TaskSupervisor("bench")
    tasks.spawn(writer.run(0.2), "writer")
    for seq, payload in enumerate(payloads):
        await writer.submit(state.apply("bench/0", seq, decoder.decode(payload), policies.version))
        await asyncio.sleep(0)
    await tasks.close()
    assert await writer.flush() and len(applied) == len(payloads)


async def measure(name: str, store: LedgerStore, payloads: list[bytes], total: int, policies: PolicySet) -> Result:
    wall, cpu = time.perf_counter(), time.process_time()
    await ingest(store, payloads, policies)
    result = Result(name, total, time.perf_counter() - wall, time.process_time() - cpu)
    await store.close()
    return result


def redis_cpu(port: int) -> float:
    info: dict[str, float] = redis.Redis(port=port).info("cpu")  # type: ignore[assignment]
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def run(batches: int, policies: PolicySet, workdir: Path, redis_port: int, ledger: Path | None) -> list[Result]:
    payloads, total = make_payloads(batches)
    path = workdir / "bench.sqlite3"
    if ledger is not None:  # into a ledger that already holds many records (a copy: the original stays as built)
        shutil.copyfile(ledger, path)
    results = [await measure("sqlite", await SqliteStore.open(path), payloads, total, policies)]
    before = redis_cpu(redis_port)
    store = await RedisStore.open(f"redis://127.0.0.1:{redis_port}/0")
    result = await measure("redis", store, payloads, total, policies)
    result.redis_cpu_s = redis_cpu(redis_port) - before
    results.append(result)
    return results


def start_redis(port: int) -> subprocess.Popen[bytes]:
    server = subprocess.Popen(["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
                              stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            redis_cpu(port)
            return server
        except redis.exceptions.ConnectionError:
            time.sleep(0.05)  # waiting for redis-server to bind
    raise TimeoutError("redis-server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=200, help="prompts (batches) to ingest")
    parser.add_argument("--policies", type=Path, default=Path("policies"))
    parser.add_argument("--ledger", type=Path, help="SQLite: ingest into a copy of this ledger (e.g. the 10M-record "
                        "one loadtests/ledger_scale.py --ledger builds) instead of an empty one")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="kvgate-bench-"))
    port = free_port()
    server = start_redis(port)
    try:
        for result in asyncio.run(run(args.batches, load_policy_set(args.policies), workdir, port, args.ledger)):
            print(result.line())
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
