"""One SQLite connection on one dedicated thread: every statement of every store of the process runs there, so
the event loop never waits on disk and two stores never contend for the file's write lock."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
BUSY_TIMEOUT_MS = 10_000


class SqliteWorker:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-sqlite")
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: Path) -> SqliteWorker:
        worker = cls(path)
        await worker._submit(worker._connect)
        return worker

    def _connect(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        db.execute("PRAGMA journal_mode = WAL")
        # Readers (`kvgate audit`, other processes) see every committed write; a power cut may lose the last
        # commits, never consistency, and skipping the per-commit fsync keeps writes cheap.
        db.execute("PRAGMA synchronous = NORMAL")
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

    def _in_transaction(self, work: Callable[..., T], args: tuple[Any, ...]) -> T:
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            result = work(db, *args)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    async def close(self) -> None:
        if self._db is not None:
            await self._submit(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)
