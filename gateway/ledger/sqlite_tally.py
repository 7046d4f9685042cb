"""Incremental audit aggregates inside the SQLite ledger: per (tenant, medium, epoch) counts, close reasons
and a lifetime histogram (1-second buckets, rounded up, so "lifetime > N s" is exact for whole seconds),
changed in the same transaction as the records they count (`TallyDelta`: each statement reports the rows
it really opened, closed or turned unknown, and the deltas are written once per flush). The audit reads
these small tables and a few indexed counts instead of every record, and closed records older than the
compaction horizon can be deleted without changing any total. Runs on the store's SQLite thread.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Mapping
from typing import Any

from gateway.ledger.records import CloseCount, LedgerSummary, LifetimeStats, TallyRow

NO_EPOCH = -1
COMPACT_SPAN = 20_000  # rowids per compaction step (one transaction of a few ms to tens of ms)

TALLY_SCHEMA = """
CREATE TABLE IF NOT EXISTS ledger_tally (
    tenant TEXT NOT NULL, medium TEXT NOT NULL, epoch INTEGER NOT NULL, stored INTEGER NOT NULL DEFAULT 0,
    removed INTEGER NOT NULL DEFAULT 0, open INTEGER NOT NULL DEFAULT 0, unknown INTEGER NOT NULL DEFAULT 0,
    last_removed_at REAL, max_lifetime REAL, PRIMARY KEY (tenant, medium, epoch)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_closes (
    tenant TEXT NOT NULL, medium TEXT NOT NULL, epoch INTEGER NOT NULL, closed_by TEXT NOT NULL,
    count INTEGER NOT NULL, PRIMARY KEY (tenant, medium, epoch, closed_by)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_lifetimes (
    tenant TEXT NOT NULL, medium TEXT NOT NULL, ceil_s INTEGER NOT NULL, count INTEGER NOT NULL, high REAL NOT NULL,
    PRIMARY KEY (tenant, medium, ceil_s)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_lifetimes_coarse (
    tenant TEXT NOT NULL, medium TEXT NOT NULL, coarse INTEGER NOT NULL, count INTEGER NOT NULL,
    PRIMARY KEY (tenant, medium, coarse)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_open_by_source (
    source TEXT NOT NULL, tenant TEXT NOT NULL, medium TEXT NOT NULL, open INTEGER NOT NULL,
    PRIMARY KEY (tenant, medium, source)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ledger_compaction (id INTEGER PRIMARY KEY CHECK (id = 1), compacted_before REAL NOT NULL);
"""

BACKFILL = """
INSERT INTO ledger_tally (tenant, medium, epoch, stored, removed, open, unknown, last_removed_at, max_lifetime)
SELECT tenant, medium, epoch, SUM(stored), SUM(removed), SUM(open), SUM(unknown), MAX(last_removed_at),
       MAX(max_lifetime)
FROM (SELECT tenant, medium, COALESCE(epoch, -1) AS epoch, COUNT(*) AS stored, COUNT(*) AS removed, 0 AS open,
             0 AS unknown, MAX(removed_at) AS last_removed_at, MAX(removed_at - stored_at) AS max_lifetime
      FROM ledger_closed GROUP BY 1, 2, 3
      UNION ALL
      SELECT tenant, medium, COALESCE(epoch, -1), COUNT(*), 0, COUNT(*), COUNT(unknown_since), NULL, NULL
      FROM ledger_open GROUP BY 1, 2, 3)
GROUP BY tenant, medium, epoch;
INSERT INTO ledger_closes SELECT tenant, medium, COALESCE(epoch, -1), closed_by, COUNT(*)
FROM ledger_closed GROUP BY 1, 2, 3, 4;
INSERT INTO ledger_lifetimes SELECT tenant, medium, CAST(MAX(0, ceil(removed_at - stored_at)) AS INTEGER), COUNT(*),
       MAX(removed_at - stored_at)
FROM ledger_closed GROUP BY 1, 2, 3;
INSERT INTO ledger_open_by_source SELECT source, tenant, medium, COUNT(*) FROM ledger_open GROUP BY 1, 2, 3;
"""


TALLY_UPSERT = """
INSERT INTO ledger_tally (tenant, medium, epoch, stored, removed, open, unknown, last_removed_at, max_lifetime)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (tenant, medium, epoch) DO UPDATE SET
    stored = stored + excluded.stored, removed = removed + excluded.removed, open = open + excluded.open,
    unknown = unknown + excluded.unknown,
    last_removed_at = MAX(COALESCE(last_removed_at, excluded.last_removed_at),
                          COALESCE(excluded.last_removed_at, last_removed_at)),
    max_lifetime = MAX(COALESCE(max_lifetime, excluded.max_lifetime), COALESCE(excluded.max_lifetime, max_lifetime))
"""
CLOSES_UPSERT = ("INSERT INTO ledger_closes VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, medium, epoch, closed_by) "
                 "DO UPDATE SET count = count + excluded.count")
OPEN_BY_SOURCE_UPSERT = ("INSERT INTO ledger_open_by_source VALUES (?, ?, ?, ?) ON CONFLICT (tenant, medium, source) "
                         "DO UPDATE SET open = open + excluded.open")
COARSE_SHIFT = 10  # a coarse bucket sums 1,024 one-second buckets: ranks are found in two short reads
COARSE_UPSERT = ("INSERT INTO ledger_lifetimes_coarse VALUES (?, ?, ?, ?) ON CONFLICT (tenant, medium, coarse) "
                 "DO UPDATE SET count = count + excluded.count")
COARSE_BACKFILL = ("INSERT INTO ledger_lifetimes_coarse SELECT tenant, medium, ceil_s >> 10, SUM(count) "
                   "FROM ledger_lifetimes GROUP BY 1, 2, 3")
LIFETIME_UPSERT = ("INSERT INTO ledger_lifetimes VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, medium, ceil_s) "
                   "DO UPDATE SET count = count + excluded.count, high = MAX(high, excluded.high)")
Key = tuple[str, str, int]  # tenant, medium, epoch (-1: none)


class TallyDelta:
    """What one flush changed, written in its transaction."""

    def __init__(self) -> None:
        self.counts: dict[Key, list[Any]] = {}  # stored, removed, open, unknown, last_removed_at, max_lifetime
        self.closes: dict[tuple[str, str, int, str], int] = {}
        self.lifetimes: dict[tuple[str, str, int], list[float]] = {}  # count, high
        self.open_by_source: dict[tuple[str, str, str], int] = {}  # (source, tenant, medium) -> change

    def _row(self, tenant: str, medium: str, epoch: int | None) -> list[Any]:
        key = (tenant, medium, NO_EPOCH if epoch is None else epoch)
        row = self.counts.get(key)
        if row is None:
            row = self.counts[key] = [0, 0, 0, 0, None, None]
        return row

    def _source_open(self, source: str, tenant: str, medium: str, change: int) -> None:
        key = (source, tenant, medium)
        self.open_by_source[key] = self.open_by_source.get(key, 0) + change

    def opened_many(self, source: str, counts: Mapping[tuple[str, str, int | None], int]) -> None:
        """`counts`: blocks opened per (tenant, medium, epoch), all on `source`."""
        for (tenant, medium, epoch), count in counts.items():
            self._source_open(source, tenant, medium, count)
            row = self._row(tenant, medium, epoch)
            row[0] += count
            row[2] += count

    def opened(self, source: str, tenant: str, medium: str, epoch: int | None) -> None:
        self._source_open(source, tenant, medium, 1)
        row = self._row(tenant, medium, epoch)
        row[0] += 1
        row[2] += 1

    def closed(self, source: str, tenant: str, medium: str, epoch: int | None, reason: str, stored_at: float,
               removed_at: float, was_unknown: bool) -> None:
        self._source_open(source, tenant, medium, -1)
        row = self._row(tenant, medium, epoch)
        lifetime = removed_at - stored_at
        row[1] += 1
        row[2] -= 1
        row[3] -= was_unknown
        row[4] = removed_at if row[4] is None else max(row[4], removed_at)
        row[5] = lifetime if row[5] is None else max(row[5], lifetime)
        key = (tenant, medium, NO_EPOCH if epoch is None else epoch, reason)
        self.closes[key] = self.closes.get(key, 0) + 1
        bucket = (tenant, medium, max(0, math.ceil(lifetime)))
        seen = self.lifetimes.get(bucket)
        if seen is None:
            self.lifetimes[bucket] = [1, lifetime]
        else:
            seen[0] += 1
            seen[1] = max(seen[1], lifetime)

    def unknown(self, tenant: str, medium: str, epoch: int | None, change: int) -> None:
        self._row(tenant, medium, epoch)[3] += change

    def write(self, db: sqlite3.Connection) -> None:
        if self.counts:
            db.executemany(TALLY_UPSERT, [(*key, *row) for key, row in self.counts.items()])
        if self.closes:
            db.executemany(CLOSES_UPSERT, [(*key, count) for key, count in self.closes.items()])
        if self.open_by_source:
            db.executemany(OPEN_BY_SOURCE_UPSERT, [(*key, change) for key, change in self.open_by_source.items()])
        if self.lifetimes:
            db.executemany(LIFETIME_UPSERT, [(*key, int(count), high) for key, (count, high) in self.lifetimes.items()])
            coarse: dict[tuple[str, str, int], int] = {}
            for (tenant, medium, ceil_s), (count, _high) in self.lifetimes.items():
                key = (tenant, medium, ceil_s >> COARSE_SHIFT)
                coarse[key] = coarse.get(key, 0) + int(count)
            db.executemany(COARSE_UPSERT, [(*key, count) for key, count in coarse.items()])


def install(db: sqlite3.Connection) -> None:
    """Create the aggregate tables and triggers; fill them from the records of a file made before them."""
    try:
        db.execute("SELECT ceil(1.5)")
    except sqlite3.OperationalError:  # an SQLite built without its math functions
        db.create_function("ceil", 1, math.ceil, deterministic=True)
    missing = {name for name in ("ledger_tally", "ledger_open_by_source", "ledger_lifetimes_coarse")
               if db.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (name,)).fetchone() is None}
    db.executescript(TALLY_SCHEMA)
    records = (db.execute("SELECT 1 FROM ledger_open LIMIT 1").fetchone() is not None
               or db.execute("SELECT 1 FROM ledger_closed LIMIT 1").fetchone() is not None)
    from_records = missing & {"ledger_tally", "ledger_open_by_source"}
    if records and from_records:
        steps = [step for step in BACKFILL.split(";") if step.strip()]
        only_open = from_records == {"ledger_open_by_source"}
        wanted = [step for step in steps if ("ledger_open_by_source" in step) == only_open
                  or from_records == {"ledger_tally", "ledger_open_by_source"}]
        db.executescript("BEGIN IMMEDIATE; " + "; ".join(wanted) + "; COMMIT;")
    if "ledger_lifetimes_coarse" in missing or "ledger_tally" in from_records:
        # from the one-second buckets (which compaction never removes), whenever those were filled anew
        db.executescript(f"BEGIN IMMEDIATE; DELETE FROM ledger_lifetimes_coarse; {COARSE_BACKFILL}; COMMIT;")  # noqa: S608


def summary(
    db: sqlite3.Connection, limits: Mapping[str, float], offsets: Mapping[str, float], now: float,
    tenant: str | None,
) -> LedgerSummary:
    """`limits`: retention per tenant; `offsets`: clock offset per source; `now`: the gateway's time."""
    where, params = ("WHERE tenant = ?", (tenant,)) if tenant is not None else ("", ())
    tallies = [TallyRow(t, m, None if e == NO_EPOCH else e, s, r, o, u, last, longest)
               for t, m, e, s, r, o, u, last, longest in db.execute(
                   f"SELECT tenant, medium, epoch, stored, removed, open, unknown, last_removed_at, max_lifetime "  # noqa: S608
                   f"FROM ledger_tally {where}", params)]
    closes = [CloseCount(t, m, None if e == NO_EPOCH else e, c, n) for t, m, e, c, n in db.execute(
        f"SELECT tenant, medium, epoch, closed_by, count FROM ledger_closes {where}", params)]  # noqa: S608
    lifetimes = {(row.tenant, row.medium): _lifetime_stats(db, row.tenant, row.medium, limits.get(row.tenant))
                 for row in _merged(tallies) if row.removed > 0}
    overdue, oldest = _open_ages(db, limits, offsets, now, tenant)
    row = db.execute("SELECT compacted_before FROM ledger_compaction WHERE id = 1").fetchone()
    return LedgerSummary(tallies, closes, lifetimes, overdue, oldest, row[0] if row else None)


def _merged(tallies: list[TallyRow]) -> list[TallyRow]:
    """One row per (tenant, medium) with the closed count summed over epochs."""
    removed: dict[tuple[str, str], int] = {}
    for row in tallies:
        removed[(row.tenant, row.medium)] = removed.get((row.tenant, row.medium), 0) + row.removed
    return [TallyRow(tenant, medium, None, 0, count, 0, 0, None, None) for (tenant, medium), count in removed.items()]


def _lifetime_stats(db: sqlite3.Connection, tenant: str, medium: str, limit: float | None) -> LifetimeStats:
    """Nearest-rank p50/p99 over the (tenant, medium) one-second buckets, found through the coarse buckets:
    the rank's coarse bucket first (at most a few hundred rows for a week of lifetimes), then the second
    inside it (at most 1,024 rows), so the cost does not grow with the spread of lifetimes."""
    coarse = db.execute("SELECT coarse, count FROM ledger_lifetimes_coarse WHERE tenant = ? AND medium = ? "
                        "ORDER BY coarse", (tenant, medium)).fetchall()
    total = sum(count for _coarse, count in coarse)
    if not total:
        return LifetimeStats(0.0, 0.0, 0.0, 0)
    longest = db.execute("SELECT high FROM ledger_lifetimes WHERE tenant = ? AND medium = ? ORDER BY ceil_s DESC "
                         "LIMIT 1", (tenant, medium)).fetchone()[0]
    p50 = _ranked(db, tenant, medium, coarse, max(1, math.ceil(0.50 * total)))
    p99 = _ranked(db, tenant, medium, coarse, max(1, math.ceil(0.99 * total)))
    outlived = 0 if limit is None else _outlived(db, tenant, medium, coarse, limit)
    return LifetimeStats(p50, p99, longest, outlived)


def _ranked(db: sqlite3.Connection, tenant: str, medium: str, coarse: list[tuple[int, int]], rank: int) -> float:
    """The longest lifetime in the one-second bucket holding the `rank`-th shortest lifetime (1-based)."""
    seen = 0
    for index, count in coarse:
        if seen + count >= rank:
            for high, fine in db.execute(
                    "SELECT high, count FROM ledger_lifetimes WHERE tenant = ? AND medium = ? AND ceil_s >= ? "
                    "AND ceil_s < ? ORDER BY ceil_s", (tenant, medium, index << COARSE_SHIFT,
                                                       (index + 1) << COARSE_SHIFT)):
                seen += fine
                if seen >= rank:
                    return float(high)
            break
        seen += count
    raise RuntimeError(f"lifetime buckets of {tenant}/{medium} disagree with their coarse sums")


def _outlived(db: sqlite3.Connection, tenant: str, medium: str, coarse: list[tuple[int, int]], limit: float) -> int:
    """Lifetimes whose bucket (the lifetime rounded up) is above `limit`: whole coarse buckets past the one
    holding it, plus the part of that one past it."""
    boundary = max(0, math.floor(limit)) >> COARSE_SHIFT
    above = sum(count for index, count in coarse if index > boundary)
    inside = db.execute("SELECT COALESCE(SUM(count), 0) FROM ledger_lifetimes WHERE tenant = ? AND medium = ? "
                        "AND ceil_s > ? AND ceil_s < ?",
                        (tenant, medium, limit, (boundary + 1) << COARSE_SHIFT)).fetchone()[0]
    return int(above + inside)


def _open_ages(
    db: sqlite3.Connection, limits: Mapping[str, float], offsets: Mapping[str, float], now: float,
    tenant: str | None,
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], float]]:
    """Indexed: the oldest open block per (tenant, medium, source), and open blocks older than retention."""
    where, params = ("AND tenant = ?", (tenant,)) if tenant is not None else ("", ())
    overdue: dict[tuple[str, str], int] = {}
    oldest: dict[tuple[str, str], float] = {}
    pairs = db.execute(f"SELECT DISTINCT tenant, medium FROM ledger_tally WHERE open > 0 {where}", params).fetchall()  # noqa: S608
    sources = [row[0] for row in db.execute("SELECT source FROM ledger_cursors UNION SELECT source FROM ledger_clock")]
    for name, medium, source in ((n, m, s) for n, m in pairs for s in sources):
        first = db.execute("SELECT MIN(stored_at) FROM ledger_open WHERE tenant = ? AND medium = ? AND source = ?",
                           (name, medium, source)).fetchone()[0]
        if first is None:
            continue
        source_now = now - offsets.get(source, 0.0)
        key = (name, medium)
        oldest[key] = max(oldest.get(key, 0.0), source_now - first)
        limit = limits.get(name)
        if limit is not None and source_now - first > limit:
            overdue[key] = overdue.get(key, 0) + _count_overdue(db, name, medium, source, source_now - limit)
    return overdue, oldest


PROBE = 2_000  # overdue blocks counted directly up to this many; past it, the young ones are counted instead
OPEN_WHERE = "tenant = ? AND medium = ? AND source = ?"


def _count_overdue(db: sqlite3.Connection, tenant: str, medium: str, source: str, threshold: float) -> int:
    """Open blocks stored before `threshold`, counting the smaller side of the index: SQLite counts a range
    entry by entry, so when most open blocks are overdue, the open total minus the young ones is cheaper."""
    params = (tenant, medium, source, threshold)
    probed = db.execute(f"SELECT COUNT(*) FROM (SELECT 1 FROM ledger_open WHERE {OPEN_WHERE} AND stored_at < ? "  # noqa: S608
                        f"LIMIT {PROBE})", params).fetchone()[0]
    if probed < PROBE:
        return int(probed)
    young = db.execute(f"SELECT COUNT(*) FROM ledger_open WHERE {OPEN_WHERE} AND stored_at >= ?",  # noqa: S608
                       params).fetchone()[0]
    row = db.execute("SELECT open FROM ledger_open_by_source WHERE tenant = ? AND medium = ? AND source = ?",
                     (tenant, medium, source)).fetchone()
    return int((row[0] if row else 0) - young)


def start_compaction(db: sqlite3.Connection, before: float) -> int:
    """Record the horizon first (a `--since` window before it may miss records from now on) and return the
    rowid range to walk: records added later are newer than any horizon."""
    db.execute("INSERT INTO ledger_compaction VALUES (1, ?) ON CONFLICT (id) DO UPDATE "
               "SET compacted_before = MAX(compacted_before, excluded.compacted_before)", (before,))
    return int(db.execute("SELECT COALESCE(MAX(rowid), 0) FROM ledger_closed").fetchone()[0])


def compact_range(db: sqlite3.Connection, before: float, low: int, high: int) -> int:
    """Delete the closed records removed before `before` among rowids (low, high]. A rowid range is read
    through the table's own B-tree, so each step costs its span, whatever the table's size (a search by
    `removed_at`, which has no index, would scan from the table's start at every step)."""
    return int(db.execute("DELETE FROM ledger_closed WHERE rowid > ? AND rowid <= ? AND removed_at < ?",
                          (low, high, before)).rowcount)
