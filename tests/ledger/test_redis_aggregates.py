"""The Redis ledger store's own totals (issue 12): rebuilt once for a ledger written before they existed,
compacted in bounded slices, batches and whole-source operations applied within a budget per call, and the
store on the process's one Redis pool (issue 10's store convention)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from gateway.cli.audit import render
from gateway.ledger.audit import collect_audit
from gateway.ledger.base import AuditReadRaced
from gateway.ledger.factory import open_store
from gateway.ledger.records import (
    CONTROL_SEQ,
    BatchOps,
    ClearOp,
    CloseOp,
    CloseReason,
    CopiesOp,
    Op,
    OpenOp,
    ResumeOp,
    SilenceOp,
)
from gateway.ledger.redis_store import RedisStore
from gateway.ledger.service import LedgerService, LedgerWiring
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import load_policy_set
from gateway.policy.reloader import PolicyHolder
from gateway.settings import Settings
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor
from tests.harness import expected_salt
from tests.ledger.audit_history import NOW, audit_policies, comparable, history, scan_and_summary
from tests.ledger.publisher import VllmPublisher, stored
from tests.ledger.redis_proc import RedisProcess
from tests.ledger.support import SECRET, Backend, Running, counts, eventually, write_policies
from tests.salt_vectors import LEDGER_SECRET

# What the apply script keeps beside the records (the records, open sets, cursors and markers stay).
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)  # a window that holds every record
AGGREGATE_KEYS = ("tally", "closes", "openby", "closed", "aggregates", "compacted_before")


def _prefix() -> str:
    return f"kvgate-test:{uuid.uuid4().hex}:"


def _drop_aggregates(url: str, prefix: str) -> None:
    """Leave the ledger as a kvgate from before the totals wrote it: records only."""
    client = redis.Redis.from_url(url)
    try:
        derived: set[bytes] = set(client.smembers(prefix + "aggkeys"))  # type: ignore[arg-type]
        assert derived  # the lifetime histograms and age indexes it lists
        client.delete(*derived, prefix + "aggkeys", *(prefix + name for name in AGGREGATE_KEYS))
    finally:
        client.close()


def test_a_ledger_from_before_the_totals_is_rebuilt_once(redis_server: RedisProcess) -> None:
    prefix = _prefix()

    async def write() -> tuple[dict[str, Any], int]:
        store = await RedisStore.open(redis_server.url, prefix)
        try:
            await store.apply(history())
            return (await scan_and_summary(store))[0], len(await store.records(None, None))
        finally:
            await store.close()

    scanned, records = asyncio.run(write())
    _drop_aggregates(redis_server.url, prefix)

    async def reopen() -> tuple[int, dict[str, Any]]:
        store = await RedisStore.open(redis_server.url, prefix)  # rebuilds the totals
        try:
            return await store.ensure_aggregates(), (await scan_and_summary(store))[1]
        finally:
            await store.close()

    again, summarised = asyncio.run(reopen())
    assert again == 0  # rebuilt once, on opening
    assert comparable(summarised) == comparable(scanned)
    client = redis.Redis.from_url(redis_server.url)
    try:
        assert client.hlen(prefix + "rec") == records  # the rebuild only added totals
        assert client.get(prefix + "aggregates") == b"1"
    finally:
        client.close()


def test_an_audit_rebuilds_the_totals_if_opening_could_not(redis_server: RedisProcess) -> None:
    """Redis unreachable while the store opened (the rebuild is skipped): the first audit does it."""
    prefix = _prefix()

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        store = await RedisStore.open(redis_server.url, prefix)
        try:
            await store.apply(history())
            scanned = (await scan_and_summary(store))[0]
            _drop_aggregates(redis_server.url, prefix)
            return scanned, (await scan_and_summary(store))[1]
        finally:
            await store.close()

    scanned, summarised = asyncio.run(scenario())
    assert comparable(summarised) == comparable(scanned)


def test_compaction_runs_in_bounded_slices_and_keeps_every_total(redis_server: RedisProcess) -> None:
    async def scenario() -> None:
        store = await RedisStore.open(redis_server.url, _prefix())
        try:
            store.compact_slice = 4
            await store.apply(history())
            scanned = (await scan_and_summary(store))[0]
            closed_before = [r for r in await store.records(None, None)
                             if r.removed_at is not None and r.removed_at < 5000.0]
            assert len(closed_before) > 3 * store.compact_slice  # several slices, one of them short
            assert await store.compact(5000.0) == len(closed_before)
            left = await store.records(None, None)
            assert not [r for r in left if r.removed_at is not None and r.removed_at < 5000.0]
            assert comparable((await scan_and_summary(store))[1]) == comparable(scanned)
        finally:
            await store.close()

    asyncio.run(scenario())


def _settings(url: str, tmp_path: Path) -> Settings:
    return Settings(salt_secret=SecretStr(LEDGER_SECRET), state_path=tmp_path / "unused.sqlite3", redis_url=url)


def test_the_ledger_uses_the_processs_redis_pool(redis_server: RedisProcess, tmp_path: Path) -> None:
    async def scenario() -> None:
        storage = await Storage.open(redis_server.url, tmp_path / "unused.sqlite3")
        try:
            store = await open_store(_settings(redis_server.url, tmp_path), _prefix(), storage=storage)
            assert isinstance(store, RedisStore)
            assert store.client is storage.redis_client()
            await store.apply(history())
            await store.close()
            assert await storage.redis_client().ping()  # type: ignore[misc]  # the pool is the Storage's to close, not the ledger's
        finally:
            await storage.close()

    asyncio.run(scenario())


def test_a_ledger_configured_for_another_redis_keeps_its_own_client(
    redis_server: RedisProcess, tmp_path: Path,
) -> None:
    other_db = redis_server.url.rsplit("/", 1)[0] + "/1"

    async def scenario() -> None:
        storage = await Storage.open(redis_server.url, tmp_path / "unused.sqlite3")
        try:
            store = await open_store(_settings(other_db, tmp_path), _prefix(), storage=storage)
            assert isinstance(store, RedisStore)
            assert store.client is not storage.redis_client() and store.owns_client
            await store.close()
        finally:
            await storage.close()

    asyncio.run(scenario())


def _source_wide_history() -> list[BatchOps]:
    """600 open blocks of one source (past Redis's small-hash encoding, so HSCAN pages), then a silence, a
    resume, and a clear of the older half."""
    opens: list[Op] = [OpenOp("GPU" if index % 2 else "CPU", index, None, "acme", 1, 100.0 + index)
                       for index in range(600)]
    return [BatchOps("p/0", 0, 1.0, "v", opens),
            BatchOps("p/0", CONTROL_SEQ, 2.0, "v", [SilenceOp(1000.0)]),
            BatchOps("p/0", 1, 3.0, "v", [ResumeOp(1100.0), CloseOp("GPU", 1, 1100.0), CopiesOp("GPU", 3, 2)]),
            BatchOps("p/0", CONTROL_SEQ, 4.0, "v", [ClearOp(None, 400.0, 1200.0, CloseReason.RESET)])]


def test_a_small_budget_per_call_gives_the_same_ledger(redis_server: RedisProcess) -> None:
    """Batches larger than a call's budget go in slices, and ops over a whole source in HSCAN pages carried
    over calls; the records, events and totals are those of one call per batch."""
    async def ledger(ops_per_call: int) -> tuple[Any, ...]:
        store = await RedisStore.open(redis_server.url, _prefix())
        try:
            store.ops_per_call = ops_per_call
            assert await store.apply(_source_wide_history()) == [True] * 4
            assert await store.apply(_source_wide_history()) == [False] * 4  # each batch applied once
            records = sorted((r.medium, r.stored_at, r.removed_at, r.closed_by, r.unknown_since)
                             for r in await store.records(None, None))
            events = [(e.kind, e.closed) for e in await store.source_events()]
            summary = await collect_audit(store, audit_policies(), None, None, now=2000.0)
            return records, events, summary, await store.cursors()
        finally:
            await store.close()

    whole, sliced = asyncio.run(ledger(100_000)), asyncio.run(ledger(7))
    assert sliced == whole
    assert whole[1] == [("silent", 600), ("resumed", 600), ("reset", 299)]  # block 1 closed before
    assert len([record for record in whole[0] if record[2] is None]) == 300


def test_a_gateways_ledger_runs_on_the_storage_pool(
    tmp_path: Path, redis_server: RedisProcess, publisher: VllmPublisher,
) -> None:
    """As `http/wiring.py` builds it: events reach the Redis ledger through the Storage's pool, and closing the
    ledger leaves that pool to the Storage."""
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, {"acme": {}})
    backend = Backend("redis", tmp_path / "unused.sqlite3", redis_url=redis_server.url)

    async def scenario() -> None:
        storage = await Storage.open(redis_server.url, backend.state_path)
        metrics = GatewayMetrics(CollectorRegistry())
        holder = PolicyHolder(root, load_policy_set(root), metrics)
        tasks = TaskSupervisor("ledger-test")
        try:
            service = await LedgerService.open(backend.settings(), metrics, holder, tasks, backend.config(),
                                               LedgerWiring(storage))
            try:
                store = service.context.store
                assert isinstance(store, RedisStore) and store.client is storage.redis_client()
                publisher.publish([stored([1, 2, 3], salt=expected_salt(SECRET, "acme", 1))])
                running = Running(service, holder, metrics)
                await eventually(running.audit, lambda report: counts(report, "acme", "GPU") == (3, 0, 3))
            finally:
                await service.close()
                await tasks.close()
            assert await storage.redis_client().ping()  # type: ignore[misc]
        finally:
            await storage.close()

    asyncio.run(scenario())


def test_an_audit_read_while_a_silence_is_part_applied_says_so(redis_server: RedisProcess) -> None:
    """A silence over more open blocks than one call's budget marks them over several calls and records its
    `silent` event with the last: a report read in between shows the partial count labelled as in progress,
    never as a settled state (`unknown` blocks with no silence, or a silence with blocks still resident)."""
    blocks, toggles = 600, 6

    async def scenario() -> None:
        store = await RedisStore.open(redis_server.url, _prefix())
        try:
            store.ops_per_call = 7  # about 90 calls per silence or resume
            await store.apply([BatchOps("p/0", 0, 1.0, "v", [OpenOp("GPU", index, None, "acme", 1, 100.0 + index)
                                                             for index in range(blocks)])])
            done = asyncio.Event()
            partial: list[tuple[int, list[str]]] = []

            async def toggle() -> None:
                for turn in range(toggles):
                    op = SilenceOp(1000.0 + turn) if turn % 2 == 0 else ResumeOp(1000.0 + turn)
                    await store.apply([BatchOps("p/0", CONTROL_SEQ, 2.0 + turn, "v", [op])])
                done.set()

            def check(report: dict[str, Any]) -> None:
                gap = next(view for view in report["gaps"] if view["source"] == "p/0")
                unknown, silent_now = report["tenants"]["acme"]["GPU"]["unknown"], gap["lost"] - gap["resumed"]
                changing = gap["changes_in_progress"]
                if not changing:
                    assert (unknown, silent_now) in ((0, 0), (blocks, 1)), (unknown, gap)
                    return
                assert (changing, silent_now) in ((["silent"], 0), (["resumed"], 1)), gap
                assert f"source p/0: {gap['missing_batches']} missing batches" in (table := render(report, "table"))
                assert f"; in progress, counts part way: {changing[0]}" in table
                partial.append((unknown, changing))

            async def audit() -> None:
                while not done.is_set():
                    check(await collect_audit(store, audit_policies(), None, None, now=NOW))
                    with contextlib.suppress(AuditReadRaced):  # read in pages: refused, not half a change
                        check(await collect_audit(store, audit_policies(), None, EPOCH, now=NOW))

            await asyncio.gather(toggle(), audit())
            assert any(0 < unknown < blocks for unknown, _changing in partial)  # mid-change reads did happen
            settled = await collect_audit(store, audit_policies(), None, EPOCH, now=NOW)
            assert all(gap["changes_in_progress"] == [] for gap in settled["gaps"])  # each change finished
            check(settled)
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_windowed_audit_says_when_writes_landed_while_it_read_the_records(redis_server: RedisProcess) -> None:
    """Records are read in HSCAN pages. A block closed and stored again meanwhile (a new record) can be read
    in both states, so a report that did not see one instant must say so: with `writes_during_read` 0 the
    counts are exact, and otherwise the count of writes is given."""
    blocks, rounds = 400, 40

    async def scenario() -> None:
        store = await RedisStore.open(redis_server.url, _prefix())
        try:
            store.scan_page = 20  # many pages, so writes land between them
            await store.apply([BatchOps("p/0", 0, 1.0, "v", [OpenOp("GPU", index, None, "acme", 1, 100.0)
                                                             for index in range(blocks)])])
            done = asyncio.Event()
            mixed: list[int] = []

            async def churn() -> None:  # every block stays resident: each batch closes and stores it again
                for turn in range(1, rounds + 1):
                    ops: list[Op] = []
                    for index in range(turn % 7, blocks, 7):
                        ops += [CloseOp("GPU", index, 100.0 + turn), OpenOp("GPU", index, None, "acme", 1,
                                                                             100.0 + turn)]
                    await store.apply([BatchOps("p/0", turn, 1.0 + turn, "v", ops)])
                done.set()

            async def audit() -> None:
                while not done.is_set():
                    report = await collect_audit(store, audit_policies(), None, EPOCH, now=NOW)
                    resident = report["tenants"]["acme"]["GPU"]["resident"]
                    if report["writes_during_read"] == 0:
                        assert resident == blocks
                    else:
                        mixed.append(resident)

            await asyncio.gather(churn(), audit())
            assert any(resident != blocks for resident in mixed)  # the label was needed: a read mixed states
            settled = await collect_audit(store, audit_policies(), None, EPOCH, now=NOW)
            assert settled["writes_during_read"] == 0 and settled["tenants"]["acme"]["GPU"]["resident"] == blocks
            assert (await collect_audit(store, audit_policies(), None, None, now=NOW))["writes_during_read"] == 0
        finally:
            await store.close()

    asyncio.run(scenario())
