"""The SQLite store's incremental aggregates give the same report as reading every record, before and after
closed records are compacted away, and for a ledger file written before the aggregates existed."""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

from gateway.ledger import sqlite_tally
from gateway.ledger.audit import collect_audit
from gateway.ledger.records import (
    CONTROL_SEQ,
    BatchOps,
    ClearOp,
    CloseOp,
    CloseReason,
    Op,
    OpenOp,
    SilenceOp,
    TenantPolicyRecord,
)
from gateway.ledger.report import AuditInputs, Window, build_report
from gateway.ledger.sqlite_store import SqliteStore
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy
from gateway.tasks import TaskSupervisor
from tests.ledger.audit_history import audit_policies

NOW = 10_000.0


def _batches() -> list[BatchOps]:
    opens: list[Op] = [OpenOp("GPU" if index % 3 else "CPU", index, None, ("acme", "globex", "gone")[index % 3],
                    1 + index % 2, 1000.0 + 7.25 * index) for index in range(60)]
    closes: list[Op] = [CloseOp("GPU" if index % 3 else "CPU", index, 1000.0 + 7.25 * index + 3.5 * (index % 40))
              for index in range(0, 60, 2)]
    return [BatchOps("p/0", 0, 1.0, "v", opens), BatchOps("p/0", 1, 2.0, "v", closes),
            BatchOps("p/0", CONTROL_SEQ, 3.0, "v", [ClearOp(("CPU",), 1300.0, 5000.0, CloseReason.RESET)]),
            BatchOps("p/0", CONTROL_SEQ, 4.0, "v", [SilenceOp(9000.0)]),
            BatchOps("p/0", 2, 5.0, "v", [OpenOp("GPU", 999, None, "acme", 2, 9500.0)]),
            # Block 1 is still open: a second open of it (another replica's view) must not count twice.
            BatchOps("p/0", 3, 6.0, "v", [OpenOp("GPU", 1, None, "globex", 1, 9600.0),
                                          OpenOp("GPU", 1000, None, "globex", 1, 9600.0)])]


async def _reports(store: SqliteStore) -> tuple[dict[str, Any], dict[str, Any]]:
    policies = audit_policies()
    offsets = {"p/0": 40.0}
    await store.record_clock(offsets, NOW)
    await store.remember_policies([TenantPolicyRecord("gone", 50.0, ("GPU",), "old", 1.0)])
    inputs = AuditInputs(await store.records(None, None), await store.missing_batches(), await store.source_events(),
                         offsets, await store.tenant_policies())
    scanned = build_report(inputs, policies, Window(NOW, None), None)
    summarised = await collect_audit(store, policies, None, None, offsets, now=NOW)
    return scanned, summarised


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key not in ("generated_at", "compacted_before")}


def test_aggregates_match_the_full_scan_and_survive_compaction(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "ledger.sqlite3")
        try:
            await store.apply(_batches())
            scanned, summarised = await _reports(store)
            assert _comparable(summarised) == _comparable(scanned)
            assert summarised["tenants"]["acme"]["GPU"]["violations"]["age"] > 0  # the comparison is not vacuous
            assert summarised["tenants"]["gone"]["GPU"]["unknown"] > 0
            deleted = await store.compact(1400.0, span=7)  # many small steps, one transaction each
            assert deleted > 0
            left = await store.records(None, None)
            assert len(left) == 62 - deleted
            assert all(record.removed_at is None or record.removed_at >= 1400.0 for record in left)
            _rescanned, after = await _reports(store)
            assert _comparable(after) == _comparable(scanned)  # the totals keep what compaction removed
            assert after["compacted_before"] is not None
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_file_from_before_the_aggregates_is_backfilled(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"

    async def write() -> dict[str, Any]:
        store = await SqliteStore.open(path)
        try:
            await store.apply(_batches())
            return (await _reports(store))[0]
        finally:
            await store.close()

    scanned = asyncio.run(write())
    with sqlite3.connect(path) as db:  # as an older kvgate left it: no aggregate tables, no triggers
        for name in ("ledger_tally", "ledger_closes", "ledger_lifetimes"):
            db.execute(f"DROP TABLE {name}")

    async def reopen() -> dict[str, Any]:
        store = await SqliteStore.open(path)
        try:
            return (await _reports(store))[1]
        finally:
            await store.close()

    assert _comparable(asyncio.run(reopen())) == _comparable(scanned)


def test_percentiles_from_buckets_are_the_nearest_rank_within_a_second(tmp_path: Path) -> None:
    lifetimes = [float(value) for value in range(1, 201)] + [5000.0]  # 201 lifetimes: p50 = 101, p99 = 199

    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "ledger.sqlite3")
        try:
            opens: list[Op] = [OpenOp("GPU", index, None, "acme", 1, 0.0) for index in range(len(lifetimes))]
            closes: list[Op] = [CloseOp("GPU", index, life) for index, life in enumerate(lifetimes)]
            await store.apply([BatchOps("p/0", 0, 1.0, "v", opens), BatchOps("p/0", 1, 2.0, "v", closes)])
            gpu = (await collect_audit(store, audit_policies(), "acme", None, now=NOW))["tenants"]["acme"]["GPU"]
            assert (gpu["lifetime_p50_s"], gpu["lifetime_p99_s"], gpu["lifetime_max_s"]) == (101.0, 199.0, 5000.0)
            assert gpu["violations"]["age"] == 101  # 101..200 and 5000 outlive 100 s
        finally:
            await store.close()

    asyncio.run(scenario())


def test_many_overdue_open_blocks_are_counted_from_the_young_side(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "ledger.sqlite3")
        try:
            old: list[Op] = [OpenOp("GPU", index, None, "acme", 1, 1000.0 + index * 0.01) for index in range(10_050)]
            young: list[Op] = [OpenOp("GPU", 10**6 + index, None, "acme", 1, NOW - 10.0) for index in range(5)]
            await store.apply([BatchOps("p/0", 0, 1.0, "v", old), BatchOps("p/0", 1, 2.0, "v", young),
                               BatchOps("p/0", 2, 3.0, "v", [CloseOp("GPU", 3, 1500.0)])])
            scanned, summarised = await _reports(store)
            assert summarised["tenants"]["acme"]["GPU"]["violations"]["age"] == 10_050  # 10,049 open + 1 closed
            assert _comparable(summarised) == _comparable(scanned)
        finally:
            await store.close()

    asyncio.run(scenario())


def test_the_audit_reads_while_the_writer_waits_for_the_file(tmp_path: Path) -> None:
    """The audit reads on its own WAL reader: a flush stuck behind another process's write lock does not hold
    it up (on one shared connection thread it would wait out the flush's busy timeout)."""
    path = tmp_path / "ledger.sqlite3"

    async def scenario() -> None:
        store = await SqliteStore.open(path, busy_timeout_ms=60_000)
        other = sqlite3.connect(path, isolation_level=None)
        tasks = TaskSupervisor("test")
        try:
            await store.apply(_batches())
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
            late = BatchOps("p/0", 9, 9.0, "v", [OpenOp("GPU", 5000, None, "acme", 1, 9_900.0)])
            stuck = tasks.spawn(store.apply([late]), "flush")
            report = await collect_audit(store, audit_policies(), "acme", None, now=NOW)
            assert not stuck.done()  # the flush still waits for the lock; the audit did not wait for it
            assert report["tenants"]["acme"]["GPU"]["stored"] > 0
            other.execute("COMMIT")
            assert await stuck == [True]
            after = await collect_audit(store, audit_policies(), "acme", None, now=NOW)
            assert after["tenants"]["acme"]["GPU"]["stored"] == report["tenants"]["acme"]["GPU"]["stored"] + 1
        finally:
            other.close()
            await tasks.close()
            await store.close()

    asyncio.run(scenario())


def test_percentiles_and_overdue_counts_across_coarse_buckets_match_the_full_scan(tmp_path: Path) -> None:
    """Lifetimes over hours (many 1,024 s coarse buckets) and a retention inside one of them: the bucketed
    report equals the one read from every record (whole-second lifetimes, so buckets are exact)."""
    rng = random.Random(3)
    lifetimes = [float(rng.randrange(0, 20_000)) for _ in range(700)]
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"], "kv_events": ["tcp://h:1"]}},
                                            "default_pool": "p"})
    acme = TenantPolicy.model_validate({"tenant": "acme", "offload": {"retention_seconds": 5_000.5}})
    policies = PolicySet(gateway=gateway, tenants={"acme": acme}, keys={}, version="now")

    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "ledger.sqlite3")
        try:
            opens: list[Op] = [OpenOp("GPU", index, None, "acme", 1, 0.0) for index in range(len(lifetimes))]
            closes: list[Op] = [CloseOp("GPU", index, life) for index, life in enumerate(lifetimes)]
            await store.apply([BatchOps("p/0", 0, 1.0, "v", opens), BatchOps("p/0", 1, 2.0, "v", closes)])
            inputs = AuditInputs(await store.records(None, None), await store.missing_batches(),
                                 await store.source_events(), {}, {})
            scanned = build_report(inputs, policies, Window(NOW, None), None)["tenants"]["acme"]["GPU"]
            summarised = (await collect_audit(store, policies, None, None, now=NOW))["tenants"]["acme"]["GPU"]
            assert summarised == scanned
            assert 0 < summarised["violations"]["age"] < len(lifetimes)
        finally:
            await store.close()

    asyncio.run(scenario())


LEGACY_SCHEMA = """
CREATE TABLE ledger_blocks (
    source TEXT NOT NULL, medium TEXT NOT NULL, hash NOT NULL, parent, tenant TEXT NOT NULL, epoch INTEGER,
    stored_at REAL NOT NULL, removed_at REAL, closed_by TEXT, policy_version TEXT NOT NULL);
CREATE UNIQUE INDEX ledger_blocks_open ON ledger_blocks(source, medium, hash) WHERE removed_at IS NULL;
INSERT INTO ledger_blocks VALUES ('p/0', 'GPU', 1, NULL, 'acme', 1, 9000.0, NULL, NULL, 'v');
INSERT INTO ledger_blocks VALUES ('p/0', 'GPU', 2, NULL, 'acme', 1, 9000.0, 9040.0, NULL, 'v');
INSERT INTO ledger_blocks VALUES ('p/0', 'CPU', 2, NULL, 'acme', 1, 9000.0, 9100.0, 'reset', 'v');
"""


def test_a_file_with_open_and_closed_records_in_one_table_is_moved_over(tmp_path: Path) -> None:
    """Ledgers written before open and closed records were split (one `ledger_blocks` table, without the copy
    and unknown columns) open with every record, the totals rebuilt from them."""
    path = tmp_path / "ledger.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(LEGACY_SCHEMA)

    async def scenario() -> None:
        store = await SqliteStore.open(path)
        try:
            assert [(block.block_hash, block.copies) for block in await store.open_blocks()] == [(1, 1)]
            stored = await store.records(None, None)
            records = sorted((r.medium, r.removed_at or 0.0, r.closed_by or "") for r in stored)
            assert records == [("CPU", 9100.0, "reset"), ("GPU", 0.0, ""), ("GPU", 9040.0, "removed")]
            acme = (await collect_audit(store, audit_policies(), "acme", None, now=NOW))["tenants"]["acme"]
            assert (acme["GPU"]["stored"], acme["GPU"]["removed"], acme["GPU"]["resident"]) == (2, 1, 1)
            assert acme["GPU"]["lifetime_max_s"] == 40.0 and acme["CPU"]["closed_by"] == {"reset": 1}
        finally:
            await store.close()

    asyncio.run(scenario())
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'ledger_blocks'").fetchone() is None


def test_overdue_open_blocks_past_the_probe_are_counted_from_the_young_side(tmp_path: Path) -> None:
    """More overdue open blocks than the direct probe counts: the total minus the young ones, still exact."""
    overdue, young = sqlite_tally.PROBE + 37, 11

    async def scenario() -> None:
        store = await SqliteStore.open(tmp_path / "ledger.sqlite3")
        try:
            opens: list[Op] = [OpenOp("GPU", index, None, "acme", 1, 1_000.0 + index * 0.001)
                               for index in range(overdue)]
            opens += [OpenOp("GPU", overdue + index, None, "acme", 1, NOW - 5.0) for index in range(young)]
            await store.apply([BatchOps("p/0", 0, 1.0, "v", opens)])
            scanned, summarised = await _reports(store)
            assert _comparable(summarised) == _comparable(scanned)
            assert summarised["tenants"]["acme"]["GPU"]["violations"]["age"] == overdue
        finally:
            await store.close()

    asyncio.run(scenario())
