"""The ledger's pure parts: attribution memory, copy counts, silences, and the report's judgements
(unknown blocks, drain proofs, one clock, tenants removed from policy)."""

from __future__ import annotations

from typing import Any

from gateway.kvevents.wire import BlockRemoved, BlockStored, EventBatch
from gateway.ledger.attribution import KnownHashes
from gateway.ledger.lifecycle import LedgerState
from gateway.ledger.records import (
    Attribution,
    BlockRecord,
    CloseOp,
    CopiesOp,
    OpenBlock,
    OpenOp,
    ResumeOp,
    SilenceOp,
    TenantPolicyRecord,
)
from gateway.ledger.report import AuditInputs, Window, build_report
from gateway.ledger.salts import DigestLru, SaltIndex
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy

ACME = Attribution("acme", 1)


def _state(capacity: int = 1_000) -> LedgerState:
    return LedgerState(SaltIndex(DigestLru(100)), KnownHashes(capacity))


def _stored(*hashes: int, parent: int | None = None, medium: str = "GPU") -> BlockStored:
    return BlockStored(list(hashes), parent, medium, None)


def test_an_empty_cache_keeps_its_configured_size() -> None:
    assert LedgerState(SaltIndex(DigestLru(100)), KnownHashes(5000)).known.capacity == 5000


def test_the_hash_cache_is_least_recently_used() -> None:
    known = KnownHashes(2)
    known.put(1, ACME)
    known.put(2, ACME)
    assert known.get(1) == ACME  # 1 is now the most recently used
    known.put(3, ACME)
    assert known.get(2) is None and known.get(1) == ACME and known.get(3) == ACME


def test_a_resident_block_keeps_its_owner_when_the_cache_forgets_it() -> None:
    state = _state(capacity=2)
    state.known.put(42, ACME)  # the root's owner, as a matched salt would leave it
    state.apply("s", 0, EventBatch(1.0, [_stored(43, parent=42)]), "v")  # acme's chain: 43 under 42
    globex = Attribution("globex", 1)
    for block in (100, 101, 102):
        state.known.put(block, globex)  # other tenants' traffic pushes 42 and 43 out of the cache
    assert state.known.get(43) is None
    ops = state.apply("s", 1, EventBatch(2.0, [_stored(43, medium="CPU")]), "v").ops  # the CPU copy of 43
    assert [(op.tenant, op.medium) for op in ops if isinstance(op, OpenOp)] == [("acme", "CPU")]


def test_copy_counts_are_emitted_and_restored() -> None:
    state = _state()
    state.known.put(7, ACME)
    ops = state.apply("s", 0, EventBatch(1.0, [_stored(8, parent=7), _stored(8, parent=7)]), "v").ops
    assert ops[-1] == CopiesOp("GPU", 8, 2)
    restarted = _state()
    restarted.load([OpenBlock("s", "GPU", 8, "acme", 1, 1.0, copies=2)])
    first = restarted.apply("s", 1, EventBatch(2.0, [BlockRemoved([8], "GPU")]), "v").ops
    assert first == [CopiesOp("GPU", 8, 1)]  # vLLM still holds a copy: nothing closes
    second = restarted.apply("s", 2, EventBatch(3.0, [BlockRemoved([8], "GPU")]), "v").ops
    assert second == [CloseOp("GPU", 8, 3.0)]


def test_a_silent_source_resumes_on_its_next_batch() -> None:
    state = _state()
    silence = state.silence("s", 5.0, "v")
    assert silence is not None and silence.ops == [SilenceOp(5.0)]
    assert state.silence("s", 6.0, "v") is None  # said once
    assert state.apply("s", 3, EventBatch(7.0, []), "v").ops == [ResumeOp(7.0)]
    assert state.resume("s", 8.0, "v") is None


def _policies(**tenants: dict[str, Any]) -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"})
    parsed = {name: TenantPolicy.model_validate({"tenant": name, **body}) for name, body in tenants.items()}
    return PolicySet(gateway=gateway, tenants=parsed, keys={}, version="now")


def _record(stored_at: float, removed_at: float | None = None, closed_by: str | None = None,
            unknown_since: float | None = None, tenant: str = "acme", medium: str = "GPU",
            source: str = "p/0") -> BlockRecord:
    return BlockRecord(source, medium, tenant, 1, stored_at, removed_at, closed_by, "v", unknown_since)


def _report(records: list[BlockRecord], policies: PolicySet, now: float = 1000.0, **extra: Any) -> dict[str, Any]:
    inputs = AuditInputs(records, extra.pop("missing", {}), [], **extra)
    return build_report(inputs, policies, Window(now, None), None)


def test_unknown_blocks_have_their_own_column_are_judged_and_block_the_drain_proof() -> None:
    policies = _policies(acme={"offload": {"retention_seconds": 100, "allowed_media": ["GPU"]}})
    records = [_record(100.0, 200.0, "removed"), _record(500.0, unknown_since=900.0),
               _record(600.0, medium="CPU", unknown_since=900.0)]
    acme = _report(records, policies)["tenants"]["acme"]
    assert (acme["GPU"]["resident"], acme["GPU"]["unknown"], acme["GPU"]["removed"]) == (0, 1, 1)
    assert acme["GPU"]["violations"]["age"] == 1  # the unknown block is 500 s old against 100 s
    assert acme["CPU"]["violations"] == {"age": 1, "medium": 1}
    epoch = acme["GPU"]["epochs"]["1"]
    assert epoch["drained_at"] is None
    assert epoch["drain"]["reasons"] == ["1 blocks unknown (their source went silent)"]


def test_a_drain_is_proven_only_by_closes_that_prove_removal_and_without_gaps() -> None:
    policies = _policies(acme={})
    proven = _report([_record(1.0, 2.0, "removed"), _record(1.0, 3.0, "restart")], policies)
    assert proven["tenants"]["acme"]["GPU"]["epochs"]["1"]["drained_at"] is not None
    legacy = _report([_record(1.0, 2.0, "removed"), _record(1.0, 3.0, "lost")], policies)
    assert legacy["tenants"]["acme"]["GPU"]["epochs"]["1"]["drain"] == {
        "proven": False, "reasons": ["1 blocks closed as 'lost', which proves no removal"]}
    gapped = _report([_record(1.0, 2.0, "removed")], policies, missing={"p/0": 3})
    assert gapped["tenants"]["acme"]["GPU"]["epochs"]["1"]["drain"] == {
        "proven": False, "reasons": ["unrecovered gap of 3 batches on p/0"]}


def test_retention_is_judged_on_the_publishers_clock() -> None:
    policies = _policies(acme={"offload": {"retention_seconds": 100}})
    # vLLM's clock is 300 s behind the gateway's: a block it stored at 800 is 100 s old at gateway time 1000.
    record = _record(650.0)
    assert _report([record], policies, clock_offsets={"p/0": 300.0})["tenants"]["acme"]["GPU"]["violations"]["age"] == 0
    assert _report([record], policies)["tenants"]["acme"]["GPU"]["violations"]["age"] == 1
    offset = _report([record], policies, clock_offsets={"p/0": 300.0})
    assert offset["tenants"]["acme"]["GPU"]["oldest_resident_age_s"] == 50.0


def test_a_tenant_removed_from_policy_is_judged_against_its_last_policy() -> None:
    policies = _policies(globex={})
    last = {"acme": TenantPolicyRecord("acme", 60.0, ("GPU",), "old-version", 1.0)}
    report = _report([_record(100.0), _record(100.0, medium="CPU")], policies, last_policies=last)
    acme = report["tenants"]["acme"]
    assert acme["GPU"]["violations"] == {"age": 1, "medium": 0}
    assert acme["CPU"]["violations"] == {"age": 1, "medium": 1}
    assert report["judged_against_last_policy"] == {"acme": "old-version"}
