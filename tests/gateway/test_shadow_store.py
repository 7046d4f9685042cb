"""Shadow stores (SQLite file, real Redis) and the batching recorder in front of them."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from gateway.shadow.compare import PairRecord
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.store import KEEP_PAIRS, ShadowStore, open_shadow_store
from gateway.storage import Storage
from tests.ledger.redis_proc import RedisProcess


def pair(tenant: str, index: int) -> PairRecord:
    return PairRecord(tenant=tenant, request_id=f"r{index}", primary_pool="offload", shadow_pool="control",
                      ttft_delta_s=-0.01 * index, duration_delta_s=0.0, cached_delta=index, compared_output=True,
                      mismatch=False, at=1000.0 + index)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis").start()
    yield server
    server.stop()


StoreFactory = Callable[[], Awaitable[tuple[ShadowStore, Storage]]]


def sqlite_store(tmp_path: Path) -> StoreFactory:
    async def open_store() -> tuple[ShadowStore, Storage]:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        return await open_shadow_store(storage), storage

    return open_store


def redis_store(url: str) -> StoreFactory:
    async def open_store() -> tuple[ShadowStore, Storage]:
        storage = await Storage.open(url, Path("unused"))
        return await open_shadow_store(storage), storage

    return open_store


@pytest.fixture(params=["sqlite", "redis"])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "sqlite":
        return sqlite_store(tmp_path)
    server: RedisProcess = request.getfixturevalue("redis_server")
    return redis_store(server.url)


def test_one_write_adds_pairs_and_counts(store_factory: StoreFactory) -> None:
    async def run() -> None:
        store, storage = await store_factory()
        await store.write([pair("a", 0), pair("a", 1), pair("b", 2)], {("a", "compared"): 2, ("a", "dropped"): 3})
        await store.write([pair("a", 3)], {("a", "compared"): 1, ("b", "error"): 1})
        assert [p.request_id for p in (await store.results("a")).pairs] == ["r3", "r1", "r0"]  # newest first
        assert (await store.results("b")).pairs == [pair("b", 2)]
        assert (await store.results("a")).counts == {"compared": 3, "dropped": 3}
        assert (await store.results("b")).counts == {"error": 1}
        await storage.close()

    asyncio.run(run())


def test_a_report_reads_pairs_and_counts_together(store_factory: StoreFactory) -> None:
    """Each write adds one pair and counts it as compared: the two reads a report makes agree, whatever writes
    land meanwhile (they were two separate reads, so a write could fall between them)."""
    writes = 150

    async def run() -> None:
        store, storage = await store_factory()
        done = asyncio.Event()
        seen: set[int] = set()

        async def write() -> None:
            for index in range(writes):
                await store.write([pair("a", index)], {("a", "compared"): 1})
            done.set()

        async def read() -> None:
            while not done.is_set():
                pairs, counts = await store.results("a")
                assert len(pairs) == counts.get("compared", 0)
                seen.add(len(pairs))

        try:
            await asyncio.gather(write(), read())
        finally:
            await storage.close()
        assert len(seen) > 1  # the reads did overlap the writes

    asyncio.run(run())


def test_only_the_latest_pairs_are_kept_per_tenant(store_factory: StoreFactory) -> None:
    async def run() -> None:
        store, storage = await store_factory()
        await store.write([pair("a", index) for index in range(KEEP_PAIRS)], {})
        await store.write([pair("a", KEEP_PAIRS + index) for index in range(3)] + [pair("b", 0)], {})
        kept = (await store.results("a")).pairs
        assert len(kept) == KEEP_PAIRS
        assert (kept[0].request_id, kept[-1].request_id) == (f"r{KEEP_PAIRS + 2}", "r3")
        assert len((await store.results("b")).pairs) == 1
        await storage.close()

    asyncio.run(run())


def test_sqlite_file_does_not_grow_past_the_kept_pairs(tmp_path: Path) -> None:
    async def run() -> None:
        store, storage = await sqlite_store(tmp_path)()
        for batch in range(3):
            await store.write([pair("a", batch * KEEP_PAIRS + index) for index in range(KEEP_PAIRS)], {})
        await storage.close()

    asyncio.run(run())
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:
        assert db.execute("SELECT COUNT(*) FROM shadow_pairs").fetchone() == (KEEP_PAIRS,)


def test_recorder_keeps_results_while_redis_is_down_and_writes_them_when_it_returns(tmp_path: Path) -> None:
    server = RedisProcess(tmp_path / "redis").start()

    async def run() -> None:
        store, storage = await redis_store(server.url)()
        recorder = ShadowRecorder(store, flush_interval_s=3600)
        recorder.add_pair(pair("a", 0))
        assert await recorder.flush()
        server.kill()
        recorder.add_pair(pair("a", 1))
        recorder.count("a", "dropped")
        assert not await recorder.flush()
        server.start()  # same port, empty: only what the recorder still holds can appear
        recorder.add_pair(pair("a", 2))
        assert await recorder.flush()
        assert [p.request_id for p in (await recorder.store.results("a")).pairs] == ["r2", "r1"]
        assert (await recorder.store.results("a")).counts == {"compared": 2, "dropped": 1}
        await storage.close()

    try:
        asyncio.run(run())
    finally:
        server.stop()


def test_recorder_writer_loop_writes_without_being_asked(tmp_path: Path) -> None:
    async def run() -> None:
        store, storage = await sqlite_store(tmp_path)()
        recorder = ShadowRecorder(store, flush_interval_s=0.01)
        async with asyncio.TaskGroup() as group:
            writer = group.create_task(recorder.run())
            recorder.add_pair(pair("a", 0))
            async with asyncio.timeout(30):  # a deadline for the poll, not a timing assertion
                while not (await recorder.store.results("a")).counts:
                    await asyncio.sleep(0.01)  # polling the store until the writer's batch lands
            writer.cancel()
        assert (await recorder.store.results("a")).counts == {"compared": 1}
        await storage.close()

    asyncio.run(run())
