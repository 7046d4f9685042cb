"""One SQLite connection on one dedicated thread: every statement of every store of the process runs there, so
the event loop never waits on disk and two stores never contend for the file's write lock.

The convention for every SQLite connection kvgate opens is this class. The process's `Storage` holds the one
shared by the request path's stores; the ledger opens its own instances (a writer and a read-only reader, see
`gateway.ledger.sqlite_store`) so that a rate-limit or admission statement never queues on one thread behind its
large flushes and compaction, and the audit never queues behind them either.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
BUSY_TIMEOUT_MS = 10_000
LOCKED_RETRY_S = 0.01


@dataclass(frozen=True)
class SqliteOptions:
    """How a worker's connection is set up. `read_only`: a WAL reader (`query_only`), which never waits for the
    file's writer and never writes. `cache_mib` / `mmap_mib`: page cache and memory-mapped reads, for files far
    larger than SQLite's 2 MiB default cache (a B-tree insert at a random place otherwise reads its pages from
    the OS cache one system call each); the mapping is the OS's page cache, not this process's heap."""

    busy_timeout_ms: int = BUSY_TIMEOUT_MS
    read_only: bool = False
    cache_mib: int | None = None
    mmap_mib: int | None = None
    thread_name: str = "kvgate-sqlite"


class SqliteWorker:
    def __init__(self, path: Path, options: SqliteOptions | None = None) -> None:
        self.path = path
        self.options = options or SqliteOptions()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.options.thread_name)
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: Path, options: SqliteOptions | None = None) -> SqliteWorker:
        worker = cls(path, options)
        try:
            await worker._submit(worker._connect)
        except BaseException:
            worker._thread.shutdown(wait=False)
            raise
        return worker

    def _connect(self) -> None:
        options = self.options
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout = {int(options.busy_timeout_ms)}")
        if options.read_only:
            db.execute("PRAGMA query_only = 1")
        else:
            switch_to_wal(db, options.busy_timeout_ms / 1000)
        # Readers (`kvgate audit`, other processes) see every committed write; a power cut may lose the last
        # commits, never consistency, and skipping the per-commit fsync keeps writes cheap.
        db.execute("PRAGMA synchronous = NORMAL")
        if options.cache_mib is not None:
            db.execute(f"PRAGMA cache_size = {-1024 * int(options.cache_mib)}")  # negative: KiB
        if options.mmap_mib is not None:
            db.execute(f"PRAGMA mmap_size = {1024 * 1024 * int(options.mmap_mib)}")
        self._db = db

    async def _submit(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, work, *args)

    @property
    def db(self) -> sqlite3.Connection:
        """The connection; use it only from inside `run` (the worker thread)."""
        if self._db is None:
            raise RuntimeError(f"the SQLite file {self.path} is closed")
        return self._db

    async def run(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(connection, *args)` on the worker thread."""
        return await self._submit(lambda: work(self.db, *args))

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(connection, *args)` in one transaction: all of it commits, or none of it."""
        return await self._submit(self._in_transaction, work, args)

    async def snapshot(self, work: Callable[..., T], *args: Any) -> T:
        """Run `work(connection, *args)` in one read transaction: every statement sees the same committed state,
        whatever other connections (worker processes, tools) commit meanwhile."""
        return await self._submit(self._in_snapshot, work, args)

    def _in_snapshot(self, work: Callable[..., T], args: tuple[Any, ...]) -> T:
        db = self.db
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.execute("BEGIN")
        try:
            return work(db, *args)
        finally:
            _rollback(db)  # nothing was written: ending the read transaction is all that is left

    def _in_transaction(self, work: Callable[..., T], args: tuple[Any, ...]) -> T:
        db = self.db
        if db.in_transaction:  # a COMMIT that failed earlier (the file was busy) left one open: start clean
            db.execute("ROLLBACK")
        db.execute("BEGIN IMMEDIATE")
        try:
            result = work(db, *args)
            db.execute("COMMIT")
        except BaseException:
            _rollback(db)
            raise
        return result

    async def close(self) -> None:
        if self._db is not None:
            await self._submit(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)


def switch_to_wal(db: sqlite3.Connection, timeout_s: float,
                  wait: Callable[[], None] = lambda: time.sleep(LOCKED_RETRY_S)) -> None:
    """Put the file in WAL mode. While another connection (a second worker starting at the same moment) writes to
    a file still in rollback mode, SQLite refuses the switch at once with "database is locked", without waiting
    for its busy timeout; so the switch is retried, on this worker thread, for as long as that timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() >= deadline:
                raise
        wait()


def _rollback(db: sqlite3.Connection) -> None:
    """Best effort: the caller sees the original error and may run the whole transaction again."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
