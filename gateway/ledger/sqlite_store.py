"""Embedded ledger store: one SQLite file (WAL), durable across gateway restarts.

Two connections, each a `gateway.storage.sqlite.SqliteWorker` (one thread each, the process's one SQLite
convention), both the ledger's own rather than the request path's shared worker:

- the **writer**: flushes, compaction and the reads the writer itself needs (cursors, open blocks). The
  rate-limit and admission statements of the request path run on the process's shared worker and must not
  queue on one thread behind a flush of thousands of block records or a compaction step (writes still take
  turns on the file's write lock, one transaction at a time).
- the **reader** (`query_only`): what the audit reads. In WAL mode a reader sees the last committed state
  and never waits for the writer, so `/admin/audit` does not queue behind a flush or a compaction step. Each
  report reads one snapshot (one read transaction), so its totals agree with each other.

Compaction deletes in small rowid ranges, one short transaction each, queued behind any flush waiting, so
neither ingestion nor the audit stalls while it runs. `kvgate audit` reads the same file from another
process while the gateway writes.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Sequence
from itertools import groupby
from pathlib import Path
from typing import Any, TypeVar

from gateway.kvevents.sequence import Cursor
from gateway.kvevents.wire import HashValue
from gateway.ledger import sqlite_tally
from gateway.ledger.audit import summary_report_from
from gateway.ledger.hashcodec import from_sql, to_sql
from gateway.ledger.records import (
    SOURCE_EVENT_KINDS,
    BatchOps,
    BlockRecord,
    ClearOp,
    CloseOp,
    CopiesOp,
    GapRecord,
    Op,
    OpenBlock,
    OpenOp,
    ResumeOp,
    SaltDigestEntry,
    SilenceOp,
    SourceEvent,
    TenantPolicyRecord,
    WindowedRead,
)
from gateway.ledger.report import AuditInputs
from gateway.policy.loader import PolicySet
from gateway.storage.sqlite import SqliteOptions, SqliteWorker

T = TypeVar("T")
MARKER_TTL_S = 86_400.0  # applied-batch markers older than this are pruned; replays reach back far less
PRUNE_EVERY = 500  # flushes
BUSY_TIMEOUT_MS = 10_000  # past this, "database is locked" is raised and the writer retries later
# Page cache and memory-mapped reads for each connection: a ledger of 10M records is ~2 GB, and its open-block
# indexes take inserts at random places, which with SQLite's 2 MiB default cache cost a read per insert.
CACHE_MIB = 256
MMAP_MIB = 4096

# Open and closed records live apart. Open records (what vLLM holds now: bounded by its caches) are keyed by
# (source, medium, hash) without a rowid, so an open, a removal or a copy count touches one B-tree plus the
# age index. Closed records are only ever appended, read whole by `--since` reports and deleted by compaction
# in rowid order: no index, so the history they accumulate (millions of rows) costs ingestion nothing.
# (The file is put in WAL mode by the writer's SqliteWorker before this runs.)
SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_open (
    source TEXT NOT NULL, medium TEXT NOT NULL, hash NOT NULL, parent, tenant TEXT NOT NULL, epoch INTEGER,
    stored_at REAL NOT NULL, policy_version TEXT NOT NULL, copies INTEGER NOT NULL DEFAULT 1, unknown_since REAL,
    PRIMARY KEY (source, medium, hash)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS ledger_open_age ON ledger_open(tenant, medium, source, stored_at);
CREATE TABLE IF NOT EXISTS ledger_closed (
    source TEXT NOT NULL, medium TEXT NOT NULL, hash NOT NULL, parent, tenant TEXT NOT NULL, epoch INTEGER,
    stored_at REAL NOT NULL, policy_version TEXT NOT NULL, unknown_since REAL, removed_at REAL NOT NULL,
    closed_by TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_applied (
    source TEXT NOT NULL, seq INTEGER NOT NULL, ts REAL NOT NULL, applied_at REAL NOT NULL,
    PRIMARY KEY (source, seq, ts)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_cursors (source TEXT PRIMARY KEY, seq INTEGER NOT NULL, ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_gaps (
    source TEXT NOT NULL, first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, after_ts REAL NOT NULL,
    PRIMARY KEY (source, first_seq, last_seq, after_ts)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_source_events (
    source TEXT NOT NULL, kind TEXT NOT NULL, boundary_ts REAL NOT NULL, learned_at REAL NOT NULL,
    closed INTEGER NOT NULL, PRIMARY KEY (source, kind, boundary_ts)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_clock (source TEXT PRIMARY KEY, offset_s REAL NOT NULL, updated_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_tenant_policies (
    tenant TEXT PRIMARY KEY, retention_s REAL, media TEXT NOT NULL, policy_version TEXT NOT NULL,
    seen_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS ledger_salt_digests (
    id INTEGER PRIMARY KEY, tenant TEXT NOT NULL, epoch INTEGER NOT NULL, digest BLOB NOT NULL UNIQUE);
"""

OPEN_SQL = ("INSERT OR IGNORE INTO ledger_open (source, medium, hash, parent, tenant, epoch, stored_at, "
            "policy_version) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
OPEN_COLUMNS = "source, medium, hash, parent, tenant, epoch, stored_at, policy_version, unknown_since"
# A batch's removals: copied to `ledger_closed` with their times (returning what the totals need), then deleted.
CLOSE_COPY_SQL = (f"INSERT INTO ledger_closed ({OPEN_COLUMNS}, removed_at, closed_by) "  # noqa: S608
                  "SELECT o.source, o.medium, o.hash, o.parent, o.tenant, o.epoch, o.stored_at, o.policy_version, "
                  "o.unknown_since, c.removed_at, 'removed' FROM temp.ledger_closing AS c JOIN ledger_open AS o "
                  "ON o.source = ? AND o.medium = c.medium AND o.hash = c.hash "
                  "RETURNING tenant, medium, epoch, stored_at, removed_at, unknown_since")
CLOSE_DELETE_SQL = ("DELETE FROM ledger_open WHERE source = ? "
                    "AND (medium, hash) IN (SELECT medium, hash FROM temp.ledger_closing)")
CLOSED_SQL = (f"INSERT INTO ledger_closed ({OPEN_COLUMNS}, removed_at, closed_by) "  # noqa: S608
              f"VALUES ({', '.join('?' * 11)})")
CURSOR_SQL = ("INSERT INTO ledger_cursors (source, seq, ts) VALUES (?, ?, ?) ON CONFLICT (source) DO UPDATE "
              "SET seq = excluded.seq, ts = excluded.ts "
              "WHERE excluded.ts > ledger_cursors.ts "
              "OR (excluded.ts = ledger_cursors.ts AND excluded.seq > ledger_cursors.seq)")
COPIES_SQL = "UPDATE ledger_open SET copies = ? WHERE source = ? AND medium = ? AND hash = ?"
RECORD_COLUMNS = "source, medium, tenant, epoch, stored_at, removed_at, closed_by, policy_version, unknown_since"
# A file from before open and closed records were split: one `ledger_blocks` table, moved over on opening.
LEGACY_COLUMNS = {"copies": "INTEGER NOT NULL DEFAULT 1", "unknown_since": "REAL"}  # added to it over time
MIGRATE_LEGACY = f"""
INSERT OR IGNORE INTO ledger_open (source, medium, hash, parent, tenant, epoch, stored_at, policy_version, copies,
    unknown_since)
SELECT source, medium, hash, parent, tenant, epoch, stored_at, policy_version, copies, unknown_since
FROM ledger_blocks WHERE removed_at IS NULL;
INSERT INTO ledger_closed ({OPEN_COLUMNS}, removed_at, closed_by)
SELECT {OPEN_COLUMNS}, removed_at, COALESCE(closed_by, 'removed') FROM ledger_blocks WHERE removed_at IS NOT NULL
ORDER BY rowid;
DROP TABLE ledger_blocks;
"""  # noqa: S608


class SqliteStore:
    def __init__(self, writer: SqliteWorker, reader: SqliteWorker) -> None:
        self.path = writer.path
        self._writer = writer
        self._reader = reader
        self._flushes = 0
        self._delta = sqlite_tally.TallyDelta()

    @classmethod
    async def open(cls, path: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> SqliteStore:
        writer = await SqliteWorker.open(path, SqliteOptions(busy_timeout_ms, False, CACHE_MIB, MMAP_MIB,
                                                             "kvgate-ledger-write"))
        try:
            await writer.run(_set_up)
            reader = await SqliteWorker.open(path, SqliteOptions(busy_timeout_ms, True, CACHE_MIB, MMAP_MIB,
                                                                 "kvgate-ledger-read"))
        except BaseException:
            await writer.close()
            raise
        return cls(writer, reader)

    @property
    def db(self) -> sqlite3.Connection:
        """The writer's connection; only from work running on the writer's thread."""
        return self._writer.db

    async def _read(self, work: Callable[..., T], *args: Any) -> T:
        """On the reader's thread, in one read transaction (one snapshot of the file)."""
        return await self._reader.snapshot(work, *args)

    async def close(self) -> None:
        try:
            await self._reader.close()
        finally:
            await self._writer.close()

    # -- writes ----------------------------------------------------------------------------------

    async def apply(self, batches: Sequence[BatchOps]) -> list[bool]:
        applied = await self._writer.transaction(self._apply, list(batches))
        self._flushes += 1
        if self._flushes % PRUNE_EVERY == 0:
            with contextlib.suppress(sqlite3.OperationalError):  # housekeeping; the batches are committed
                await self._writer.run(_prune_markers, time.time() - MARKER_TTL_S)
        return applied

    def _apply(self, db: sqlite3.Connection, batches: list[BatchOps]) -> list[bool]:
        now = time.time()
        self._delta = sqlite_tally.TallyDelta()
        applied = [self._apply_one(batch, now) for batch in batches]
        self._delta.write(db)
        return applied

    def _apply_one(self, batch: BatchOps, now: float) -> bool:
        marker = self.db.execute("INSERT OR IGNORE INTO ledger_applied VALUES (?, ?, ?, ?)", (*batch.key, now))
        if marker.rowcount == 0:
            return False
        for kind, run in groupby(batch.ops, key=type):
            self._run_ops(batch, kind, list(run))
        if batch.seq >= 0:
            self.db.execute(CURSOR_SQL, batch.key)
        return True

    def _run_ops(self, batch: BatchOps, kind: type, ops: list[Op]) -> None:
        if kind is OpenOp:
            self._open(batch, [op for op in ops if isinstance(op, OpenOp)])
        elif kind is CloseOp:
            self._close(batch, [op for op in ops if isinstance(op, CloseOp)])
        elif kind is CopiesOp:
            self.db.executemany(COPIES_SQL, [(op.copies, batch.source, op.medium, to_sql(op.block_hash))
                                             for op in ops if isinstance(op, CopiesOp)])
        else:
            for op in ops:
                if isinstance(op, ClearOp):
                    self._clear(batch, op)
                elif isinstance(op, SilenceOp):
                    self._silence(batch, op)
                elif isinstance(op, ResumeOp):
                    self._resume(batch, op)

    def _open(self, batch: BatchOps, ops: list[OpenOp]) -> None:
        """A block already open (another replica's batch, a store of a resident hash) is ignored and not
        counted. All rows go in with one statement; only when fewer went in than were offered is it undone
        and redone row by row, to count the ones that were new."""
        db = self.db
        rows = [_open_row(batch, op) for op in ops]
        before_changes = db.total_changes
        db.execute("SAVEPOINT ledger_open_rows")
        db.executemany(OPEN_SQL, rows)
        opened = self._delta.opened
        if db.total_changes - before_changes == len(ops):
            db.execute("RELEASE ledger_open_rows")
            self._delta.opened_many(batch.source, Counter((op.tenant, op.medium, op.epoch) for op in ops))
            return
        db.execute("ROLLBACK TO ledger_open_rows")
        db.execute("RELEASE ledger_open_rows")
        for op, row in zip(ops, rows, strict=True):
            if db.execute(OPEN_SQL, row).rowcount:
                opened(batch.source, op.tenant, op.medium, op.epoch)

    def _close(self, batch: BatchOps, ops: list[CloseOp]) -> None:
        """All removals of a run in two statements, through a temporary key table: the records are copied to
        `ledger_closed` (which returns what the totals need) and deleted from `ledger_open`. Each keeps its
        own removal time (the first, if a block is named twice: the second removal found it closed)."""
        removed_at: dict[tuple[str, Any], float] = {}
        for op in ops:
            removed_at.setdefault((op.medium, to_sql(op.block_hash)), op.removed_at)
        db = self.db
        db.executemany("INSERT INTO temp.ledger_closing VALUES (?, ?, ?)",
                       [(medium, block, at) for (medium, block), at in removed_at.items()])
        rows = db.execute(CLOSE_COPY_SQL, (batch.source,)).fetchall()
        db.execute(CLOSE_DELETE_SQL, (batch.source,))
        db.execute("DELETE FROM temp.ledger_closing")
        closed = self._delta.closed
        for tenant, medium, epoch, stored_at, at, unknown_since in rows:
            closed(batch.source, tenant, medium, epoch, "removed", stored_at, at, unknown_since is not None)

    def _move_closed(self, batch: BatchOps, rows: list[Any], removed_at: list[float], reason: str) -> None:
        """Rows deleted from `ledger_open` (OPEN_COLUMNS) go to `ledger_closed` and into the totals."""
        self.db.executemany(CLOSED_SQL, [(*row, at, reason) for row, at in zip(rows, removed_at, strict=True)])
        closed = self._delta.closed
        for (_source, medium, _hash, _parent, tenant, epoch, stored_at, _version, unknown_since), at in zip(
                rows, removed_at, strict=True):
            closed(batch.source, tenant, medium, epoch, reason, stored_at, at, unknown_since is not None)

    def _silence(self, batch: BatchOps, op: SilenceOp) -> None:
        rows = self.db.execute("UPDATE ledger_open SET unknown_since = ? WHERE source = ? "
                               "AND unknown_since IS NULL RETURNING tenant, medium, epoch",
                               (op.since, batch.source)).fetchall()
        for tenant, medium, epoch in rows:
            self._delta.unknown(tenant, medium, epoch, 1)
        self._source_event(batch, "silent", op.since, len(rows))

    def _resume(self, batch: BatchOps, op: ResumeOp) -> None:
        rows = self.db.execute("UPDATE ledger_open SET unknown_since = NULL WHERE source = ? "
                               "AND unknown_since IS NOT NULL RETURNING tenant, medium, epoch",
                               (batch.source,)).fetchall()
        for tenant, medium, epoch in rows:
            self._delta.unknown(tenant, medium, epoch, -1)
        self._source_event(batch, "resumed", op.at, len(rows))

    def _source_event(self, batch: BatchOps, kind: str, at: float, count: int) -> None:
        self.db.execute("INSERT OR IGNORE INTO ledger_source_events VALUES (?, ?, ?, ?, ?)",
                        (batch.source, kind, batch.ts, at, count))

    def _clear(self, batch: BatchOps, op: ClearOp) -> None:
        where: list[str] = ["source = ?"]
        params: list[Any] = [batch.source]
        if op.media is not None:
            where.append(f"medium IN ({', '.join('?' * len(op.media))})")
            params.extend(op.media)
        if op.stored_before is not None:
            where.append("stored_at < ?")
            params.append(op.stored_before)
        sql = f"DELETE FROM ledger_open WHERE {' AND '.join(where)} RETURNING {OPEN_COLUMNS}"  # noqa: S608
        rows = self.db.execute(sql, params).fetchall()
        self._move_closed(batch, rows, [op.at] * len(rows), op.reason)
        if op.reason in SOURCE_EVENT_KINDS:
            self._source_event(batch, op.reason, op.at, len(rows))

    async def record_gaps(self, gaps: Sequence[GapRecord]) -> None:
        rows = [(gap.source, gap.first_seq, gap.last_seq, gap.after_ts) for gap in gaps]
        await self._writer.transaction(_write_many, "INSERT OR IGNORE INTO ledger_gaps VALUES (?, ?, ?, ?)", rows)

    async def remember_salts(self, entries: Sequence[SaltDigestEntry]) -> None:
        rows = [(entry.tenant, entry.epoch, entry.digest) for entry in entries]
        sql = "INSERT OR IGNORE INTO ledger_salt_digests (tenant, epoch, digest) VALUES (?, ?, ?)"
        await self._writer.transaction(_write_many, sql, rows)

    # -- reads -----------------------------------------------------------------------------------

    async def salt_entries(self, after: int) -> tuple[list[SaltDigestEntry], int]:
        rows = await self._writer.run(_select, "SELECT id, tenant, epoch, digest FROM ledger_salt_digests WHERE id > ? "
                               "ORDER BY id", (after,))
        entries = [SaltDigestEntry(tenant, epoch, digest) for _id, tenant, epoch, digest in rows]
        return entries, (rows[-1][0] if rows else after)

    async def cursors(self) -> dict[str, Cursor]:
        rows = await self._writer.run(_select, "SELECT source, seq, ts FROM ledger_cursors", ())
        return {source: Cursor(seq, ts) for source, seq, ts in rows}

    async def open_blocks(self) -> list[OpenBlock]:
        sql = "SELECT source, medium, hash, tenant, epoch, stored_at, copies, unknown_since FROM ledger_open"
        rows = await self._writer.run(_select, sql, ())
        return [OpenBlock(source, medium, _stored_hash(block_hash), tenant, epoch, stored_at, copies,
                          unknown is not None)
                for source, medium, block_hash, tenant, epoch, stored_at, copies, unknown in rows]

    async def record_clock(self, offsets: dict[str, float], at: float) -> None:
        sql = ("INSERT INTO ledger_clock VALUES (?, ?, ?) ON CONFLICT (source) DO UPDATE "
               "SET offset_s = excluded.offset_s, updated_at = excluded.updated_at")
        await self._writer.transaction(_write_many, sql, [(source, offset, at) for source, offset in offsets.items()])

    async def clock_offsets(self) -> dict[str, float]:
        return await self._read(_clock_offsets)

    async def remember_policies(self, entries: Sequence[TenantPolicyRecord]) -> None:
        sql = ("INSERT INTO ledger_tenant_policies VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant) DO UPDATE "
               "SET retention_s = excluded.retention_s, media = excluded.media, "
               "policy_version = excluded.policy_version, seen_at = excluded.seen_at")
        rows = [(e.tenant, e.retention_s, ",".join(e.media), e.policy_version, e.seen_at) for e in entries]
        await self._writer.transaction(_write_many, sql, rows)

    async def tenant_policies(self) -> dict[str, TenantPolicyRecord]:
        return await self._read(_tenant_policies)

    @staticmethod
    def _records_query(since: float | None, tenant: str | None) -> tuple[str, tuple[Any, ...]]:
        closed: list[str] = ["1 = 1"]
        opened: list[str] = ["1 = 1"]
        params: list[Any] = []
        if since is not None:
            closed.append("removed_at >= ?")
            params.append(since)
        if tenant is not None:
            closed.append("tenant = ?")
            opened.append("tenant = ?")
            params.append(tenant)
        sql = (f"SELECT {RECORD_COLUMNS} FROM ledger_closed WHERE {' AND '.join(closed)} UNION ALL "  # noqa: S608
               f"SELECT source, medium, tenant, epoch, stored_at, NULL, NULL, policy_version, unknown_since "
               f"FROM ledger_open WHERE {' AND '.join(opened)}")
        params += [tenant] if tenant is not None else []
        return sql, tuple(params)

    async def records(self, since: float | None, tenant: str | None) -> list[BlockRecord]:
        return [BlockRecord(*row) for row in await self._read(_select, *self._records_query(since, tenant))]

    async def windowed_read(self, since: float | None, tenant: str | None) -> WindowedRead:
        """Everything in one read snapshot: a flush, whole-source ops included, is one transaction."""
        return await self._read(_windowed_read, *self._records_query(since, tenant))

    async def compact(self, before: float, span: int = sqlite_tally.COMPACT_SPAN) -> int:
        """Delete closed records removed before `before`; the audit's totals keep them. In rowid ranges of
        `span`, one short transaction each: a flush waiting on the writer's thread runs between two."""
        end = await self._writer.transaction(sqlite_tally.start_compaction, before)
        deleted, low = 0, 0
        while low < end:
            high = min(end, low + span)
            deleted += await self._writer.transaction(sqlite_tally.compact_range, before, low, high)
            low = high
        return deleted

    async def missing_batches(self) -> dict[str, int]:
        return await self._read(_missing_batches)

    async def source_events(self) -> list[SourceEvent]:
        return await self._read(_source_events)

    async def summary_report(
        self, policies: PolicySet, tenant: str | None, clock_offsets: dict[str, float], now: float,
    ) -> dict[str, Any]:
        """The unwindowed audit in one call on the reader's thread, from one snapshot (`OneReadStore`)."""
        return await self._read(_summary_report, policies, tenant, clock_offsets, now)


def _clock_offsets(db: sqlite3.Connection) -> dict[str, float]:
    return dict(db.execute("SELECT source, offset_s FROM ledger_clock").fetchall())


def _tenant_policies(db: sqlite3.Connection) -> dict[str, TenantPolicyRecord]:
    rows = db.execute("SELECT tenant, retention_s, media, policy_version, seen_at FROM ledger_tenant_policies")
    return {tenant: TenantPolicyRecord(tenant, retention, tuple(filter(None, media.split(","))), version, seen)
            for tenant, retention, media, version, seen in rows}


def _missing_batches(db: sqlite3.Connection) -> dict[str, int]:
    return dict(db.execute("SELECT source, SUM(last_seq - first_seq + 1) FROM ledger_gaps GROUP BY source"))


def _source_events(db: sqlite3.Connection) -> list[SourceEvent]:
    sql = "SELECT source, kind, boundary_ts, learned_at, closed FROM ledger_source_events ORDER BY learned_at"
    return [SourceEvent(*row) for row in db.execute(sql)]


def _windowed_read(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> WindowedRead:
    records = [BlockRecord(*row) for row in _select(db, sql, params)]
    return WindowedRead(records, _missing_batches(db), _source_events(db), {}, 0)


def _summary_report(
    db: sqlite3.Connection, policies: PolicySet, tenant: str | None, clock_offsets: dict[str, float], now: float,
) -> dict[str, Any]:
    inputs = AuditInputs([], _missing_batches(db), _source_events(db), _clock_offsets(db) | clock_offsets,
                         _tenant_policies(db))
    return summary_report_from(lambda limits, offsets: sqlite_tally.summary(db, limits, offsets, now, tenant),
                               inputs, policies, tenant, now)


def _set_up(db: sqlite3.Connection) -> None:
    db.executescript(SCHEMA)
    present = {row[1] for row in db.execute("PRAGMA table_info(ledger_blocks)")}
    if present:
        for column, kind in LEGACY_COLUMNS.items():
            if column not in present:
                db.execute(f"ALTER TABLE ledger_blocks ADD COLUMN {column} {kind}")
        db.executescript(f"BEGIN IMMEDIATE; {MIGRATE_LEGACY} COMMIT;")
    sqlite_tally.install(db)
    db.execute("PRAGMA temp_store = MEMORY")  # the removals' key table lives for one statement: no file for it
    db.execute("DROP TABLE IF EXISTS temp.ledger_closing")
    db.execute("CREATE TEMP TABLE ledger_closing (medium TEXT NOT NULL, hash NOT NULL, removed_at REAL NOT NULL)")


def _write_many(db: sqlite3.Connection, sql: str, rows: list[tuple[Any, ...]]) -> None:
    db.executemany(sql, rows)


def _prune_markers(db: sqlite3.Connection, before: float) -> None:
    db.execute("DELETE FROM ledger_applied WHERE applied_at < ?", (before,))


def _select(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return db.execute(sql, params).fetchall()


def _open_row(batch: BatchOps, op: OpenOp) -> tuple[Any, ...]:
    return (batch.source, op.medium, to_sql(op.block_hash), to_sql(op.parent_hash), op.tenant, op.epoch,
            op.stored_at, batch.policy_version)


def _stored_hash(value: int | bytes) -> HashValue:
    restored = from_sql(value)
    assert restored is not None  # the column is NOT NULL
    return restored
