"""Shadow pairs and counters in the process's SQLite file, on its one SQLite worker."""

from __future__ import annotations

import sqlite3

from gateway.shadow.compare import PairRecord
from gateway.shadow.store.base import KEEP_PAIRS, OutcomeCounts, TenantResults, decode_pair, encode_pair
from gateway.storage.sqlite import SqliteWorker

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS shadow_pairs (id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, pair BLOB NOT NULL)",
    "CREATE INDEX IF NOT EXISTS shadow_pairs_tenant ON shadow_pairs (tenant, id)",
    "CREATE TABLE IF NOT EXISTS shadow_counts (tenant TEXT NOT NULL, outcome TEXT NOT NULL, "
    "n INTEGER NOT NULL, PRIMARY KEY (tenant, outcome))",
)
COUNT_SQL = "INSERT INTO shadow_counts VALUES (?, ?, ?) ON CONFLICT (tenant, outcome) DO UPDATE SET n = n + excluded.n"
TRIM_SQL = (
    "DELETE FROM shadow_pairs WHERE tenant = ? AND id <= "
    "(SELECT id FROM shadow_pairs WHERE tenant = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
)


class SqliteShadowStore:
    """One table of pairs and one of counters."""

    def __init__(self, worker: SqliteWorker) -> None:
        self.worker = worker

    @classmethod
    async def open(cls, worker: SqliteWorker) -> SqliteShadowStore:
        await worker.run(_create)
        return cls(worker)

    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        rows = [(pair.tenant, encode_pair(pair)) for pair in pairs]
        await self.worker.transaction(_write, rows, [(*key, n) for key, n in counts.items()])

    async def results(self, tenant: str) -> TenantResults:
        return await self.worker.snapshot(_results, tenant)

    async def close(self) -> None:
        return None  # the worker belongs to the process's Storage


def _create(db: sqlite3.Connection) -> None:
    for statement in SCHEMA:
        db.execute(statement)


def _write(db: sqlite3.Connection, rows: list[tuple[str, bytes]], counts: list[tuple[str, str, int]]) -> None:
    db.executemany("INSERT INTO shadow_pairs (tenant, pair) VALUES (?, ?)", rows)
    db.executemany(TRIM_SQL, [(tenant, tenant, KEEP_PAIRS) for tenant in {t for t, _ in rows}])
    db.executemany(COUNT_SQL, counts)


def _results(db: sqlite3.Connection, tenant: str) -> TenantResults:
    pairs = db.execute("SELECT pair FROM shadow_pairs WHERE tenant = ? ORDER BY id DESC LIMIT ?", (tenant, KEEP_PAIRS))
    kept = [decode_pair(row[0]) for row in pairs]
    counts = db.execute("SELECT outcome, n FROM shadow_counts WHERE tenant = ?", (tenant,))
    return TenantResults(kept, {str(outcome): int(n) for outcome, n in counts})
