"""The parts LedgerService is composed of, reached directly: the salt keeper over a real store (SQLite and
Redis), and the clock-offset estimate."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.ledger.factory import open_store
from gateway.ledger.ingest import CLOCK_SAMPLES, ClockOffsets
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.records import Attribution, BatchOps
from gateway.ledger.salt_keeper import SaltKeeper
from gateway.ledger.salts import DigestLru, SaltIndex
from gateway.ledger.writer import BatchWriter
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.salts import derive_salt
from tests.ledger.support import SECRET, Backend, write_policies

POOLS: dict[str, list[str]] = {"main": []}  # no KV-event source: nothing here subscribes


def _ignore(_batch: BatchOps) -> None:
    return None


def _keeper(policies: PolicySet, writer: BatchWriter, capacity: int = 100) -> SaltKeeper:
    index = SaltIndex.build(policies, SECRET.encode(), DigestLru(capacity))
    return SaltKeeper(index, SECRET.encode(), writer, LedgerMetrics(GatewayMetrics(CollectorRegistry())))


def test_a_user_salt_issued_here_is_matched_by_another_replica_through_the_store(
    tmp_path: Path, backend: Backend,
) -> None:
    policies = load_policy_set(write_policies(tmp_path / "policies", POOLS, {"acme": {}}))
    salt = derive_salt(SECRET.encode(), "acme", 1, "u1")

    async def scenario() -> None:
        store = await open_store(backend.settings(), backend.prefix)
        try:
            issuing = _keeper(policies, BatchWriter(store, 100_000, _ignore, _ignore))
            issuing.remember_user_salt("acme", 1, "u1")
            issuing.remember_user_salt("acme", 1, "u1")  # a repeat is a lookup, not a second digest
            assert issuing.index.match([salt]) == Attribution("acme", 1)
            assert await issuing.writer.flush()
            other = _keeper(policies, BatchWriter(store, 100_000, _ignore, _ignore))
            assert other.index.match([salt]) is None
            await other.refresh(store)
            assert other.index.match([salt]) == Attribution("acme", 1)
            assert len(other.index.remembered) == 1
        finally:
            await store.close()

    asyncio.run(scenario())


def test_a_policy_set_rebuilds_the_index_and_keeps_what_was_remembered(tmp_path: Path, backend: Backend) -> None:
    first = load_policy_set(write_policies(tmp_path / "one", POOLS, {"acme": {}}))
    raised = load_policy_set(write_policies(tmp_path / "two", POOLS, {"acme": {"cache": {"salt_epoch": 2}}}))
    user_salt = derive_salt(SECRET.encode(), "acme", 1, "u1")

    async def scenario() -> None:
        store = await open_store(backend.settings(), backend.prefix)
        try:
            keeper = _keeper(first, BatchWriter(store, 100_000, _ignore, _ignore))
            keeper.remember_user_salt("acme", 1, "u1")
            rebuilt = keeper.rebuild(raised)
            assert rebuilt is keeper.index
            assert rebuilt.match([user_salt]) == Attribution("acme", 1)  # an earlier epoch still attributes
            assert rebuilt.match([derive_salt(SECRET.encode(), "acme", 2)]) == Attribution("acme", 2)
        finally:
            await store.close()

    asyncio.run(scenario())


def test_the_clock_offset_is_the_least_delay_of_the_recent_samples() -> None:
    clocks = ClockOffsets()
    clocks.sample("s", 5.0)
    clocks.sample("s", 2.0)
    clocks.sample("s", 3.0)
    assert clocks.snapshot() == {"s": 2.0}
    for _ in range(CLOCK_SAMPLES):
        clocks.sample("s", 4.0)  # the 2.0 has left the window
    assert clocks.offsets == {"s": 4.0}
    snapshot = clocks.snapshot()
    clocks.sample("s", 1.0)
    assert snapshot == {"s": 4.0}  # a snapshot is a copy
