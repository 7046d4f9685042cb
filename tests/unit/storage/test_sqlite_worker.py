"""The process's one SQLite worker on real files: its pragmas, all-or-nothing transactions (whatever the work
raises), errors that leave the connection usable, serialised concurrent writers, and a clear error after close."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from gateway.storage import Backend, Storage
from gateway.storage.sqlite import BUSY_TIMEOUT_MS, SqliteWorker


def create(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, n INTEGER NOT NULL)")


def rows(db: sqlite3.Connection) -> dict[str, int]:
    return {str(k): int(n) for k, n in db.execute("SELECT k, n FROM t")}


def insert(db: sqlite3.Connection, pairs: list[tuple[str, int]]) -> None:
    db.executemany("INSERT INTO t VALUES (?, ?)", pairs)


async def opened(path: Path) -> SqliteWorker:
    worker = await SqliteWorker.open(path)
    await worker.run(create)
    return worker


def test_the_connection_is_set_up_for_one_writer_and_many_readers(tmp_path: Path) -> None:
    async def run() -> tuple[str, int, int]:
        worker = await SqliteWorker.open(tmp_path / "deep" / "er" / "state.sqlite3")  # parents are created
        mode = await worker.run(lambda db: db.execute("PRAGMA journal_mode").fetchone()[0])
        busy = await worker.run(lambda db: db.execute("PRAGMA busy_timeout").fetchone()[0])
        sync = await worker.run(lambda db: db.execute("PRAGMA synchronous").fetchone()[0])
        await worker.close()
        return mode, busy, sync

    assert asyncio.run(run()) == ("wal", BUSY_TIMEOUT_MS, 1)  # synchronous 1 = NORMAL


def test_run_passes_arguments_and_returns_the_result(tmp_path: Path) -> None:
    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        await worker.run(insert, [("a", 1), ("b", 2)])
        assert await worker.run(rows) == {"a": 1, "b": 2}
        assert await worker.run(lambda db, k: db.execute("SELECT n FROM t WHERE k = ?", (k,)).fetchone(), "b") == (2,)
        await worker.close()

    asyncio.run(run())


class Interrupted(BaseException):
    """Not an Exception: stands for a cancellation or interrupt that reaches the work."""


@pytest.mark.parametrize("failure", [RuntimeError("half-way"), sqlite3.IntegrityError("dup"), Interrupted()])
def test_a_transaction_that_raises_leaves_nothing_and_the_worker_stays_usable(tmp_path: Path,
                                                                              failure: BaseException) -> None:
    def insert_then_fail(db: sqlite3.Connection) -> None:
        insert(db, [("x", 1), ("y", 2)])
        raise failure

    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        with pytest.raises(type(failure)):
            await worker.transaction(insert_then_fail)
        assert await worker.run(rows) == {}
        await worker.transaction(insert, [("z", 3)])
        assert await worker.run(rows) == {"z": 3}
        await worker.close()

    asyncio.run(run())


def test_a_constraint_violation_inside_a_transaction_rolls_back_the_earlier_statements(tmp_path: Path) -> None:
    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        await worker.run(insert, [("a", 1)])
        with pytest.raises(sqlite3.IntegrityError):
            await worker.transaction(insert, [("b", 2), ("a", 9)])  # b goes in, then a collides
        assert await worker.run(rows) == {"a": 1}
        await worker.close()

    asyncio.run(run())


def test_a_failing_statement_outside_a_transaction_raises_and_the_connection_goes_on(tmp_path: Path) -> None:
    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        with pytest.raises(sqlite3.OperationalError, match="no such table"):
            await worker.run(lambda db: db.execute("SELECT * FROM missing"))
        assert await worker.run(rows) == {}
        await worker.close()

    asyncio.run(run())


def test_a_transaction_inside_a_transaction_is_refused(tmp_path: Path) -> None:
    def nested(db: sqlite3.Connection) -> None:
        insert(db, [("a", 1)])
        db.execute("BEGIN IMMEDIATE")

    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        with pytest.raises(sqlite3.OperationalError, match="within a transaction"):
            await worker.transaction(nested)
        assert await worker.run(rows) == {}
        await worker.close()

    asyncio.run(run())


def test_concurrent_read_modify_write_transactions_never_lose_an_update(tmp_path: Path) -> None:
    def bump(db: sqlite3.Connection) -> None:
        (n,) = db.execute("SELECT n FROM t WHERE k = 'c'").fetchone()
        db.execute("UPDATE t SET n = ? WHERE k = 'c'", (n + 1,))

    async def run() -> int:
        worker = await opened(tmp_path / "s.sqlite3")
        await worker.run(insert, [("c", 0)])
        await asyncio.gather(*(worker.transaction(bump) for _ in range(200)))
        count = (await worker.run(rows))["c"]
        await worker.close()
        return count

    assert asyncio.run(run()) == 200


def test_after_close_the_worker_says_the_file_is_closed(tmp_path: Path) -> None:
    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        await worker.close()
        with pytest.raises(RuntimeError, match=r"closed|shutdown"):
            await worker.run(rows)
        await worker.close()  # a second close is harmless
        with pytest.raises(RuntimeError, match=r"the SQLite file .*s\.sqlite3 is closed"):
            _ = worker.db

    asyncio.run(run())


def test_what_a_worker_committed_another_process_reads(tmp_path: Path) -> None:
    async def run() -> None:
        worker = await opened(tmp_path / "s.sqlite3")
        await worker.transaction(insert, [("a", 1)])
        with sqlite3.connect(tmp_path / "s.sqlite3") as other:  # while the worker is still open (WAL)
            assert other.execute("SELECT n FROM t").fetchall() == [(1,)]
        await worker.close()

    asyncio.run(run())


def test_an_unopenable_path_fails_at_open(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")

    async def run() -> None:
        with pytest.raises(OSError):
            await SqliteWorker.open(tmp_path / "a-file" / "state.sqlite3")  # a parent that is a file

    asyncio.run(run())


def test_a_file_that_is_not_a_database_fails_at_open(tmp_path: Path) -> None:
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"this is not an SQLite database, just some bytes" * 100)

    async def run() -> None:
        with pytest.raises(sqlite3.DatabaseError):
            await SqliteWorker.open(path)

    asyncio.run(run())


def test_storage_closes_what_it_opened_and_names_its_backend(tmp_path: Path) -> None:
    async def run() -> None:
        storage = await Storage.open("", tmp_path / "state.sqlite3")  # an empty URL means no Redis
        assert storage.backend is Backend.SQLITE and str(storage.backend) == "sqlite"
        worker = storage.sqlite_worker()
        await storage.close()
        with pytest.raises(RuntimeError):
            _ = worker.db

    asyncio.run(run())
