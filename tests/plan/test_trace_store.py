"""The reuse-trace store on a SQLite file and on a real redis-server, built on a Storage as the gateway builds it:
one behaviour for both."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import pytest

from gateway.reuse.record import TraceRecord, encode_record
from gateway.reuse.store import SCHEMA, TraceStore, open_trace_store
from gateway.storage import Storage
from tests.ledger.redis_proc import RedisProcess

StoreSession = Callable[[int], AbstractAsyncContextManager[TraceStore]]


def record(tenant: str, ts: float, epoch: int = 1, chain: bytes = b"\x01" * 16) -> TraceRecord:
    return TraceRecord(ts=ts, tenant=tenant, pool="offload", epoch=epoch, prompt_tokens=40, cached_tokens=16,
                       completion_tokens=2, text=False, chunk_units=16, tokens_per_chunk=16.0, rate=1.0, chain=chain)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "redis"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSession:
    url = None if request.param == "sqlite" else request.getfixturevalue("redis_server").url

    @asynccontextmanager
    async def session(keep: int) -> AsyncIterator[TraceStore]:
        storage = await Storage.open(url, tmp_path / "state.sqlite3")
        try:
            yield await open_trace_store(storage, keep)
        finally:
            await storage.close()

    return session


def with_store(make_store: StoreSession, keep: int, check: Callable[[TraceStore], Awaitable[None]]) -> None:
    async def run() -> None:
        async with make_store(keep) as store:
            await check(store)

    asyncio.run(run())


def test_write_read_since_and_tenants(make_store: StoreSession) -> None:
    async def check(store: TraceStore) -> None:
        await store.write([record("a", 10.0), record("b", 11.0), record("a", 12.0, chain=b"\x02" * 8)])
        await store.write([record("a", 12.0, chain=b"\x02" * 8)])  # equal records are both kept
        assert [r.ts for r in await store.read("a", None)] == [10.0, 12.0, 12.0]
        assert [r.tenant for r in await store.read(None, 11.0)] == ["b", "a", "a"]
        assert await store.tenants() == ["a", "b"]
        assert (await store.read("b", None))[0] == record("b", 11.0)

    with_store(make_store, 100, check)


def test_bounded_per_tenant_oldest_first(make_store: StoreSession) -> None:
    async def check(store: TraceStore) -> None:
        await store.write([record("a", float(i)) for i in range(5)] + [record("b", 1.0)])
        await store.write([record("a", 5.0)])
        assert [r.ts for r in await store.read("a", None)] == [3.0, 4.0, 5.0]
        assert len(await store.read("b", None)) == 1

    with_store(make_store, 3, check)


def test_retention_and_forget(make_store: StoreSession) -> None:
    async def check(store: TraceStore) -> None:
        await store.write([record("a", 1.0, epoch=1), record("a", 5.0, epoch=2), record("a", 9.0, epoch=3),
                           record("b", 1.0)])
        assert await store.expire("a", 5.0) == 1
        assert [r.ts for r in await store.read("a", None)] == [5.0, 9.0]
        assert await store.erase("a", below_epoch=3) == 1
        assert [r.epoch for r in await store.read("a", None)] == [3]
        assert await store.erase("a") == 1
        assert await store.read("a", None) == []
        assert len(await store.read("b", None)) == 1

    with_store(make_store, 100, check)


def test_an_erasure_counts_exactly_what_it_deleted_while_writes_go_on(make_store: StoreSession) -> None:
    """`kvgate tenant forget` prints the count as its receipt: every record written is either counted by an
    erasure or still there (the Redis store counted, then deleted, in two commands)."""
    async def check(store: TraceStore) -> None:
        done = asyncio.Event()
        written, erased = 0, 0

        async def write() -> None:
            nonlocal written
            for index in range(200):
                await store.write([record("a", float(index))])
                written += 1
            done.set()

        async def erase() -> None:
            nonlocal erased
            while not done.is_set():
                erased += await store.erase("a")

        await asyncio.gather(write(), erase())
        assert erased > 0 and erased + len(await store.read("a", None)) == written

    with_store(make_store, 1000, check)


def test_the_bound_counts_what_expiry_and_erasure_removed(make_store: StoreSession) -> None:
    """Wrong version: a count that forgets deletions trims records that are within the bound."""
    async def check(store: TraceStore) -> None:
        await store.write([record("a", 1.0, epoch=1), record("a", 2.0, epoch=1), record("a", 3.0, epoch=2)])
        assert await store.erase("a", below_epoch=2) == 2
        assert await store.expire("a", 0.5) == 0
        await store.write([record("a", 4.0, epoch=2), record("a", 5.0, epoch=2)])
        assert [r.ts for r in await store.read("a", None)] == [3.0, 4.0, 5.0]
        await store.write([record("a", 6.0, epoch=2)])
        assert [r.ts for r in await store.read("a", None)] == [4.0, 5.0, 6.0]

    with_store(make_store, 3, check)


def test_a_file_from_before_the_counts_is_counted_once_and_bounded(tmp_path: Path) -> None:
    """A state file whose trace table predates `reuse_trace_counts`: its rows are counted when the store opens, by
    one process only, and the bound holds from the first write on."""
    path = tmp_path / "state.sqlite3"
    with sqlite3.connect(path) as db:
        for statement in SCHEMA:
            db.execute(statement)
        db.executemany("INSERT INTO reuse_trace (tenant, ts, epoch, record) VALUES (?, ?, ?, ?)",
                       [("a", float(i), 1, encode_record(record("a", float(i)))) for i in range(5)])
    db.close()

    async def run() -> list[float]:
        first, second = await Storage.open(None, path), await Storage.open(None, path)
        try:
            store = await open_trace_store(first, 4)
            await open_trace_store(second, 4)  # a second process opening the same file counts nothing again
            await store.write([record("a", 5.0)])
            return [r.ts for r in await store.read("a", None)]
        finally:
            await first.close()
            await second.close()

    assert asyncio.run(run()) == [2.0, 3.0, 4.0, 5.0]
