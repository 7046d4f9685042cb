"""The shadow store's one contract run over both backends (a real SQLite file, a real redis-server): atomic
write of pairs and counters, newest first, per-tenant trimming to the kept number, counters that add up; the
pair encoding; and the recorder's batching, its retry after a failed write and its bound on what it holds."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.shadow import recorder as recorder_module
from gateway.shadow.compare import PairRecord
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.store import ShadowStore, open_shadow_store
from gateway.shadow.store import redis as redis_store
from gateway.shadow.store import sqlite as sqlite_store
from gateway.shadow.store.base import decode_pair, encode_pair
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor
from tests.ledger.redis_proc import RedisProcess


def pair(tenant: str = "acme", n: int = 0, **changes: object) -> PairRecord:
    fields: dict[str, object] = dict(tenant=tenant, request_id=f"req-{n}", primary_pool="offload",
                                     shadow_pool="control", ttft_delta_s=-0.01 * n, duration_delta_s=0.5,
                                     cached_delta=n, compared_output=True, mismatch=False, at=1000.0 + n)
    fields.update(changes)
    return PairRecord(**fields)  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str | None, Path]:
    if request.param == "sqlite":
        return None, tmp_path / "state.sqlite3"
    server: RedisProcess = request.getfixturevalue("redis_server")
    return server.url, tmp_path / "unused.sqlite3"


@asynccontextmanager
async def opened(backend: tuple[str | None, Path]) -> AsyncIterator[ShadowStore]:
    redis_url, path = backend
    storage = await Storage.open(redis_url, path)
    if redis_url:
        await storage.redis_client().flushdb()
    try:
        yield await open_shadow_store(storage)
    finally:
        await storage.close()


def run_with(backend: tuple[str | None, Path], body: Callable[[ShadowStore], Awaitable[None]]) -> None:
    async def run() -> None:
        async with opened(backend) as store:
            await body(store)

    asyncio.run(run())


@pytest.mark.redis
def test_an_empty_store_has_no_pairs_and_no_counts(backend: tuple[str | None, Path]) -> None:
    async def body(store: ShadowStore) -> None:
        assert (await store.results("acme")).pairs == []
        assert (await store.results("acme")).counts == {}
        await store.write([], {})  # nothing to write is not an error
        assert (await store.results("acme")).pairs == []

    run_with(backend, body)


@pytest.mark.redis
def test_pairs_come_back_newest_first_per_tenant(backend: tuple[str | None, Path]) -> None:
    async def body(store: ShadowStore) -> None:
        await store.write([pair("acme", 0), pair("beta", 1), pair("acme", 2)], {})
        await store.write([pair("acme", 3)], {})
        assert [p.request_id for p in (await store.results("acme")).pairs] == ["req-3", "req-2", "req-0"]
        assert (await store.results("beta")).pairs == [pair("beta", 1)]
        assert (await store.results("nobody")).pairs == []

    run_with(backend, body)


@pytest.mark.redis
def test_counts_add_up_across_writes_per_tenant_and_outcome(backend: tuple[str | None, Path]) -> None:
    async def body(store: ShadowStore) -> None:
        await store.write([], {("acme", "compared"): 2, ("acme", "dropped"): 1, ("beta", "error"): 4})
        await store.write([], {("acme", "compared"): 3})
        assert (await store.results("acme")).counts == {"compared": 5, "dropped": 1}
        assert (await store.results("beta")).counts == {"error": 4}

    run_with(backend, body)


async def held(storage: Storage, tenant: str) -> int:
    """How many pairs the backend really holds for a tenant (reads are clipped too, so ask underneath)."""
    if storage.redis is not None:
        return int(await storage.redis.llen(f"kvgate:shadow:pairs:{tenant}"))  # type: ignore[misc]
    rows = await storage.sqlite_worker().run(
        lambda db: db.execute("SELECT COUNT(*) FROM shadow_pairs WHERE tenant = ?", (tenant,)).fetchone())
    return int(rows[0])


@pytest.mark.redis
def test_only_the_latest_pairs_are_kept_per_tenant(backend: tuple[str | None, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_store, "KEEP_PAIRS", 3)
    monkeypatch.setattr(redis_store, "KEEP_PAIRS", 3)

    async def run() -> None:
        redis_url, path = backend
        storage = await Storage.open(redis_url, path)
        if redis_url:
            await storage.redis_client().flushdb()
        store = await open_shadow_store(storage)
        await store.write([pair("acme", n) for n in range(2)] + [pair("beta", 9)], {})
        await store.write([pair("acme", n) for n in range(2, 7)], {})
        assert [p.request_id for p in (await store.results("acme")).pairs] == ["req-6", "req-5", "req-4"]
        assert (await store.results("beta")).pairs == [pair("beta", 9)]  # another tenant's pairs are not trimmed away
        assert (await held(storage, "acme"), await held(storage, "beta")) == (3, 1)  # bounded underneath
        await storage.close()

    asyncio.run(run())


@pytest.mark.redis
def test_every_field_of_a_pair_survives_the_store(backend: tuple[str | None, Path]) -> None:
    odd = pair("acme", 1, ttft_delta_s=None, cached_delta=None, compared_output=False, mismatch=False,
               request_id="req-ünïcode-✓", duration_delta_s=-1e-9, at=1.7e9)

    async def body(store: ShadowStore) -> None:
        await store.write([odd], {})
        assert (await store.results("acme")).pairs == [odd]

    run_with(backend, body)


def test_a_failed_sqlite_write_leaves_neither_pairs_nor_counts(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_shadow_store(storage)
        await storage.sqlite_worker().run(lambda db: db.execute("DROP TABLE shadow_counts"))
        with pytest.raises(sqlite3.OperationalError):
            await store.write([pair()], {("acme", "compared"): 1})
        kept = await storage.sqlite_worker().run(lambda db: db.execute("SELECT COUNT(*) FROM shadow_pairs").fetchone())
        assert kept == (0,)  # the pair inserted before the failure was rolled back
        await storage.close()

    asyncio.run(run())


PAIRS = st.builds(
    PairRecord, tenant=st.text(min_size=1, max_size=12), request_id=st.text(max_size=20),
    primary_pool=st.text(max_size=8), shadow_pool=st.text(max_size=8),
    ttft_delta_s=st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
    duration_delta_s=st.floats(allow_nan=False, allow_infinity=False),
    cached_delta=st.one_of(st.none(), st.integers(-(2**62), 2**62)), compared_output=st.booleans(),
    mismatch=st.booleans(), at=st.floats(0, 4e9))


@settings(max_examples=80, deadline=None)
@given(PAIRS)
def test_the_pair_encoding_round_trips(record: PairRecord) -> None:
    encoded = encode_pair(record)
    assert decode_pair(encoded) == record
    assert decode_pair(encoded.decode()) == record  # Redis may hand back str with decode_responses


def test_the_pair_encoding_is_json_with_named_fields() -> None:
    assert encode_pair(pair(n=1)) == (
        b'{"tenant":"acme","request_id":"req-1","primary_pool":"offload","shadow_pool":"control",'
        b'"ttft_delta_s":-0.01,"duration_delta_s":0.5,"cached_delta":1,"compared_output":true,"mismatch":false,'
        b'"at":1001.0}')


# --- the recorder ----------------------------------------------------------------------------------------------


def test_recorded_results_reach_the_store_in_one_flush(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        store = await open_shadow_store(storage)
        recorder = ShadowRecorder(store, flush_interval_s=60.0)
        recorder.add_pair(pair("acme", 1))
        recorder.count("acme", "dropped")
        recorder.count("acme", "dropped")
        assert (await store.results("acme")).pairs == []  # held in memory until a flush
        assert await recorder.flush() is True
        assert (await store.results("acme")).pairs == [pair("acme", 1)]
        assert (await store.results("acme")).counts == {"compared": 1, "dropped": 2}  # a pair counts as compared
        assert await recorder.flush() is True  # nothing left: no second write
        assert (await store.results("acme")).counts == {"compared": 1, "dropped": 2}
        await storage.close()

    asyncio.run(run())


def test_a_failed_write_keeps_the_batch_in_order_for_the_next_flush(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        worker = storage.sqlite_worker()
        store = await open_shadow_store(storage)
        recorder = ShadowRecorder(store, flush_interval_s=60.0)
        recorder.add_pair(pair("acme", 1))
        await worker.run(lambda db: db.execute("ALTER TABLE shadow_pairs RENAME TO parked"))
        assert await recorder.flush() is False  # the store failed: nothing lost
        recorder.add_pair(pair("acme", 2))  # recorded while the store was away
        await worker.run(lambda db: db.execute("ALTER TABLE parked RENAME TO shadow_pairs"))
        assert await recorder.flush() is True
        assert [p.request_id for p in (await store.results("acme")).pairs] == ["req-2", "req-1"]
        assert (await store.results("acme")).counts == {"compared": 2}
        await storage.close()

    asyncio.run(run())


def test_while_the_store_is_away_only_the_newest_pairs_are_held(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorder_module, "MAX_PENDING_PAIRS", 2)

    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        worker = storage.sqlite_worker()
        store = await open_shadow_store(storage)
        recorder = ShadowRecorder(store, flush_interval_s=60.0)
        await worker.run(lambda db: db.execute("ALTER TABLE shadow_pairs RENAME TO parked"))
        for n in range(3):
            recorder.add_pair(pair("acme", n))
        assert await recorder.flush() is False
        recorder.add_pair(pair("acme", 3))
        await worker.run(lambda db: db.execute("ALTER TABLE parked RENAME TO shadow_pairs"))
        await recorder.close()  # the final flush at shutdown
        assert [p.request_id for p in (await store.results("acme")).pairs] == ["req-3", "req-2"]
        assert (await store.results("acme")).counts == {"compared": 4}  # counters are never given up
        await storage.close()

    asyncio.run(run())


@pytest.mark.redis
def test_the_writer_loop_flushes_on_its_own(redis_server: RedisProcess, tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(redis_server.url, tmp_path / "unused.sqlite3")
        client: aioredis.Redis = storage.redis_client()
        await client.delete("kvgate:shadow:pairs:loop", "kvgate:shadow:counts:loop")
        store = await open_shadow_store(storage)
        recorder = ShadowRecorder(store, flush_interval_s=0.01)
        tasks = TaskSupervisor("test-shadow-writer")
        tasks.spawn(recorder.run(), "shadow-writer")
        recorder.add_pair(pair("loop", 1))
        async with asyncio.timeout(10):  # bounds the wait only; the event is the pair appearing in Redis
            while (await store.results("loop")).pairs == []:
                await asyncio.sleep(0.01)
        await tasks.close()  # cancels the writer loop
        assert (await store.results("loop")).counts == {"compared": 1}
        await storage.close()

    asyncio.run(run())
