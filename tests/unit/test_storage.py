"""The process's one SQLite worker: statements off the event loop's thread, transactions all-or-nothing."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from gateway.storage import Backend, Storage
from gateway.storage.sqlite import SqliteOptions, SqliteWorker, switch_to_wal


def _create(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE t (n INTEGER NOT NULL)")


def _insert_then_fail(db: sqlite3.Connection, values: list[int]) -> None:
    db.executemany("INSERT INTO t VALUES (?)", [(value,) for value in values])
    raise RuntimeError("half-way")


def _insert(db: sqlite3.Connection, values: list[int]) -> int:
    db.executemany("INSERT INTO t VALUES (?)", [(value,) for value in values])
    return len(values)


def _count(db: sqlite3.Connection) -> int:
    row = db.execute("SELECT COUNT(*) FROM t").fetchone()
    return int(row[0])


def _thread_name(db: sqlite3.Connection) -> str:
    return threading.current_thread().name


def test_a_failed_transaction_leaves_nothing_and_a_good_one_everything(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open(None, tmp_path / "state.sqlite3")
        worker = storage.sqlite_worker()
        await worker.run(_create)
        with pytest.raises(RuntimeError, match="half-way"):
            await worker.transaction(_insert_then_fail, [1, 2, 3])
        assert await worker.run(_count) == 0
        assert await worker.transaction(_insert, [1, 2, 3]) == 3
        assert await worker.run(_count) == 3
        assert (await worker.run(_thread_name)).startswith("kvgate-sqlite")
        await storage.close()

    asyncio.run(run())
    with sqlite3.connect(tmp_path / "state.sqlite3") as db:  # committed: another connection sees it
        assert db.execute("SELECT COUNT(*) FROM t").fetchone() == (3,)


def test_the_backend_is_chosen_once_from_the_redis_url(tmp_path: Path) -> None:
    async def run() -> None:
        sqlite = await Storage.open(None, tmp_path / "a.sqlite3")
        assert sqlite.backend is Backend.SQLITE
        with pytest.raises(RuntimeError, match="SQLite, not Redis"):
            sqlite.redis_client()
        await sqlite.close()
        redis = await Storage.open("redis://127.0.0.1:9/0", tmp_path / "b.sqlite3")  # no connection is made yet
        assert redis.backend is Backend.REDIS
        with pytest.raises(RuntimeError, match="Redis, not SQLite"):
            redis.sqlite_worker()
        await redis.close()
        assert not (tmp_path / "b.sqlite3").exists()

    asyncio.run(run())


def test_a_read_only_worker_reads_committed_writes_and_refuses_its_own(tmp_path: Path) -> None:
    """The ledger's audit reader: `query_only`, on its own thread, sees what the writer committed."""
    path = tmp_path / "state.sqlite3"

    async def run() -> None:
        writer = await SqliteWorker.open(path)
        reader = await SqliteWorker.open(path, SqliteOptions(read_only=True, cache_mib=8, mmap_mib=16,
                                                             thread_name="kvgate-test-read"))
        try:
            await writer.run(_create)
            await writer.transaction(_insert, [1, 2])
            assert await reader.run(_count) == 2
            assert (await reader.run(_thread_name)).startswith("kvgate-test-read")
            with pytest.raises(sqlite3.OperationalError, match="readonly"):
                await reader.transaction(_insert, [3])
            assert await reader.run(_count) == 2  # the refused transaction left the reader usable
        finally:
            await reader.close()
            await writer.close()

    asyncio.run(run())


def test_the_switch_to_wal_waits_out_another_connection_writing_to_a_fresh_file(tmp_path: Path) -> None:
    """Two workers opening a new file at once: one writes (rollback mode still) while the other asks for WAL,
    which SQLite refuses at once, busy timeout or not. The switch is retried; here the writer commits the first
    time the switch has to wait."""
    path = tmp_path / "fresh.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE t (n INTEGER)")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA busy_timeout = 10000")
    waits: list[int] = []

    def writer_commits() -> None:
        waits.append(1)
        writer.execute("COMMIT")

    switch_to_wal(other, timeout_s=60, wait=writer_commits)
    assert waits == [1]
    assert other.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    other.close()
    writer.close()


def test_the_switch_to_wal_gives_up_past_its_timeout(tmp_path: Path) -> None:
    path = tmp_path / "held.sqlite3"
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE t (n INTEGER)")
    other = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        switch_to_wal(other, timeout_s=0)
    other.close()
    writer.close()
