"""The ledger's pure parts, directly: block lifecycle, chain attribution and the salt index.

Hand-computed expectations: every op, tenant, epoch and lifetime below is written out, and salts come from
the literal vectors in tests/salt_vectors.py (never from gateway.salts).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from gateway.kvevents.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KvEvent
from gateway.ledger.attribution import KnownHashes, attribute_event
from gateway.ledger.lifecycle import SWEEP_CHUNK, LedgerState, SourceEnd
from gateway.ledger.records import (
    CONTROL_SEQ,
    UNATTRIBUTED,
    Attribution,
    ClearOp,
    Closed,
    CloseOp,
    CloseReason,
    CopiesOp,
    OpenBlock,
    OpenOp,
    SaltDigestEntry,
)
from gateway.ledger.salts import DIGEST_BYTES, DigestLru, SaltIndex, salt_digest, user_salt_entry
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy
from tests.salt_vectors import LEDGER_SECRET, known_salt

SECRET = LEDGER_SECRET.encode()
ACME_1 = known_salt(LEDGER_SECRET, "acme", 1)
ACME_2 = known_salt(LEDGER_SECRET, "acme", 2)
GLOBEX_1 = known_salt(LEDGER_SECRET, "globex", 1)
GLOBEX_U1 = known_salt(LEDGER_SECRET, "globex", 1, "u1")
GLOBEX_U2 = known_salt(LEDGER_SECRET, "globex", 1, "u2")
INITECH_1 = known_salt(LEDGER_SECRET, "initech", 1)
INITECH_2 = known_salt(LEDGER_SECRET, "initech", 2)
ACME = Attribution("acme", 2)


def policies(**epochs: int) -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"})
    tenants = {name: TenantPolicy.model_validate({"tenant": name, "cache": {"salt_epoch": epoch}})
               for name, epoch in epochs.items()}
    return PolicySet(gateway=gateway, tenants=tenants, keys={}, version="v1")


def remembered(users: list[SaltDigestEntry] | None = None, capacity: int = 1000) -> DigestLru:
    lru = DigestLru(capacity)
    for entry in users or []:
        lru.add(entry)
    return lru


def index(users: list[SaltDigestEntry] | None = None) -> SaltIndex:
    return SaltIndex.build(policies(acme=2, globex=1), SECRET, remembered(users))


def stored(hashes: list[int], salt: str | None = None, parent: int | None = None, medium: str | None = None,
           extra: Any = None) -> BlockStored:
    extra_keys = extra if extra is not None else ([[salt]] if salt is not None else None)
    return BlockStored(block_hashes=list(hashes), parent_block_hash=parent, medium=medium, extra_keys=extra_keys)


def batch(ts: float, *events: KvEvent) -> EventBatch:
    return EventBatch(ts, list(events))


# -- salt index --------------------------------------------------------------------------------------------


def test_salt_digest_is_the_first_16_bytes_of_sha256() -> None:
    assert DIGEST_BYTES == 16
    assert salt_digest("abc") == bytes.fromhex("ba7816bf8f01cfea414140de5dae2223")


def test_every_epoch_up_to_the_current_one_matches() -> None:
    salts = index()
    assert salts.match([known_salt(LEDGER_SECRET, "acme", 1)]) == Attribution("acme", 1)
    assert salts.match([ACME_2]) == Attribution("acme", 2)
    assert salts.match([GLOBEX_1]) == Attribution("globex", 1)
    assert salts.match([INITECH_1]) is None  # not a configured tenant
    assert len(salts) == 3 + 2  # acme epochs 0, 1, 2; globex 0, 1


def test_a_later_epoch_than_the_policy_has_reached_does_not_match() -> None:
    assert SaltIndex.build(policies(initech=1), SECRET, remembered()).match([INITECH_2]) is None
    assert SaltIndex.build(policies(initech=2), SECRET, remembered()).match([INITECH_2]) == Attribution("initech", 2)


def test_without_a_secret_nothing_matches() -> None:
    salts = SaltIndex.build(policies(acme=2), None, remembered())
    assert salts.match([ACME_2]) is None
    assert len(salts) == 0


def test_user_salts_match_once_remembered() -> None:
    u1 = user_salt_entry(SECRET, "globex", 1, "u1")
    assert u1 == SaltDigestEntry("globex", 1, salt_digest(GLOBEX_U1))
    salts = index([u1])
    assert salts.match([GLOBEX_U1]) == Attribution("globex", 1)
    assert salts.match([GLOBEX_U2]) is None
    assert salts.users() == [u1]


def test_user_salts_of_unknown_tenants_or_unreached_epochs_are_kept_but_do_not_match() -> None:
    future = SaltDigestEntry("globex", 2, salt_digest("future"))
    stranger = SaltDigestEntry("nobody", 0, salt_digest("stranger"))
    negative = SaltDigestEntry("globex", -1, salt_digest("negative"))
    current = SaltDigestEntry("globex", 1, salt_digest("current"))
    oldest = SaltDigestEntry("globex", 0, salt_digest("oldest"))
    salts = index([future, stranger, negative, current, oldest])
    assert [salts.match([name]) for name in ("future", "stranger", "negative")] == [None, None, None]
    assert salts.match(["current"]) == Attribution("globex", 1)
    assert salts.match(["oldest"]) == Attribution("globex", 0)
    assert len(salts) == 5 + 5  # derived: acme epochs 0-2, globex 0-1; plus the five remembered users
    assert salts.users() == [future, stranger, negative, current, oldest]


def test_match_looks_at_strings_in_a_list_only() -> None:
    salts = index()
    assert salts.match(None) is None
    assert salts.match(ACME_2) is None  # a bare string is not a key list
    assert salts.match({"salt": ACME_2}) is None
    assert salts.match([1, b"x", "lora-name", ACME_2]) == Attribution("acme", 2)
    assert salts.match((ACME_2,)) == Attribution("acme", 2)


# -- attribution ------------------------------------------------------------------------------------------


def test_known_hashes_forget_the_oldest_first() -> None:
    known = KnownHashes(capacity=2)
    known.put(1, ACME)
    known.put(2, ACME)
    known.put(3, Attribution("globex", 1))
    assert len(known) == 2
    assert known.get(1) is None
    assert known.get(2) == ACME and known.get(3) == Attribution("globex", 1)
    assert known.get(None) is None


def test_a_salted_root_attributes_its_whole_chain_and_remembers_it() -> None:
    known = KnownHashes()
    owners = attribute_event(stored([1, 2, 3], ACME_2), index(), known)
    assert owners == [ACME, ACME, ACME]
    assert [known.get(h) for h in (1, 2, 3)] == [ACME, ACME, ACME]


def test_children_inherit_through_their_parent() -> None:
    known = KnownHashes()
    known.put(10, ACME)
    assert attribute_event(stored([11, 12], parent=10), index(), known) == [ACME, ACME]
    assert known.get(12) == ACME


def test_a_child_whose_first_block_is_known_keeps_that_owner() -> None:
    known = KnownHashes()
    known.put(11, Attribution("globex", 1))
    assert attribute_event(stored([11, 12], parent=99), index(), known) == [Attribution("globex", 1)] * 2


def test_a_child_of_an_unknown_parent_is_unattributed_as_a_chain() -> None:
    known = KnownHashes()
    known.put(21, ACME)  # not the first block: a chain's owner is decided by its start
    assert attribute_event(stored([20, 21], parent=99), index(), known) == [UNATTRIBUTED, UNATTRIBUTED]
    assert known.get(20) is None


def test_an_unsalted_root_is_looked_up_block_by_block() -> None:
    """Offload placeholders name GPU hashes of unrelated chains: each inherits on its own."""
    known = KnownHashes()
    known.put(5, ACME)
    known.put(7, Attribution("globex", 1))
    owners = attribute_event(stored([5, 6, 7]), index(), known)
    assert owners == [ACME, UNATTRIBUTED, Attribution("globex", 1)]
    assert known.get(6) is None


def test_a_root_with_an_unknown_salt_is_looked_up_block_by_block() -> None:
    known = KnownHashes()
    known.put(8, ACME)
    assert attribute_event(stored([8, 9], "not-a-salt"), index(), known) == [ACME, UNATTRIBUTED]
    assert attribute_event(stored([8], extra=[]), index(), known) == [ACME]


def test_an_event_without_hashes_attributes_nothing() -> None:
    assert attribute_event(stored([], ACME_2), index(), KnownHashes()) == []
    assert attribute_event(stored([], parent=3), index(), KnownHashes()) == []


# -- lifecycle ---------------------------------------------------------------------------------------------


def test_a_stored_chain_opens_one_record_per_block_with_its_parent() -> None:
    state = LedgerState(index())
    out = state.apply("s", 4, batch(100.0, stored([1, 2], ACME_2, medium="cpu")), "v1")
    assert (out.source, out.seq, out.ts, out.policy_version) == ("s", 4, 100.0, "v1")
    assert out.ops == [OpenOp("CPU", 1, None, "acme", 2, 100.0), OpenOp("CPU", 2, 1, "acme", 2, 100.0)]
    assert out.closed == []
    assert state.resident_counts == Counter({("acme", "CPU"): 2})
    assert set(state.resident("s")) == {("CPU", 1), ("CPU", 2)}
    assert state.resident("other") == {}


def test_a_block_without_a_medium_is_gpu() -> None:
    state = LedgerState(index())
    out = state.apply("s", 0, batch(1.0, stored([1], ACME_2, parent=None)), "v")
    assert out.ops == [OpenOp("GPU", 1, None, "acme", 2, 1.0)]


def test_a_duplicate_store_is_counted_once_and_closes_with_its_last_copy() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(10.0, stored([1], ACME_2)), "v")
    again = state.apply("s", 1, batch(20.0, stored([1], ACME_2)), "v")
    assert again.ops == [CopiesOp("GPU", 1, 2)]  # no new record; the copy count is persisted
    first_removal = state.apply("s", 2, batch(30.0, BlockRemoved([1])), "v")
    assert first_removal.ops == [CopiesOp("GPU", 1, 1)] and first_removal.closed == []
    last_removal = state.apply("s", 3, batch(45.0, BlockRemoved([1])), "v")
    assert last_removal.ops == [CloseOp("GPU", 1, 45.0)]
    assert last_removal.closed == [Closed("acme", "GPU", 35.0, False)]
    assert state.resident_counts[("acme", "GPU")] == 0
    assert state.resident("s") == {}


def test_removing_an_unknown_block_still_closes_it_in_the_store() -> None:
    state = LedgerState(index())
    out = state.apply("s", 0, batch(5.0, BlockRemoved([42], medium="CPU")), "v")
    assert out.ops == [CloseOp("CPU", 42, 5.0)]
    assert out.closed == []


def test_removal_is_per_medium() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(1.0, stored([1], ACME_2), stored([1], parent=None, medium="CPU", extra=[[ACME_2]])), "v")
    out = state.apply("s", 1, batch(2.0, BlockRemoved([1], medium="CPU")), "v")
    assert out.closed == [Closed("acme", "CPU", 1.0, False)]
    assert set(state.resident("s")) == {("GPU", 1)}


def test_clearing_the_gpu_cache_closes_gpu_blocks_only() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(1.0, stored([1], ACME_2), stored([2], ACME_2, medium="CPU")), "v")
    out = state.apply("s", 1, batch(4.0, AllBlocksCleared()), "v")
    assert out.ops == [ClearOp(("GPU",), None, 4.0, CloseReason.CLEARED)]
    assert out.closed == [Closed("acme", "GPU", 3.0, False)]
    assert set(state.resident("s")) == {("CPU", 2)}
    assert state.resident_counts == Counter({("acme", "GPU"): 0, ("acme", "CPU"): 1})


def test_a_source_end_closes_only_blocks_stored_before_the_boundary() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(10.0, stored([1], ACME_2)), "v")
    state.apply("s", 1, batch(20.0, stored([2], ACME_2, medium="CPU")), "v")
    state.apply("s", 2, batch(30.0, stored([3], ACME_2)), "v")
    out = state.close_source("s", SourceEnd(CloseReason.RESTART, 25.0, 30.0, 40.0), "v2")
    assert (out.source, out.seq, out.ts, out.policy_version) == ("s", CONTROL_SEQ, 25.0, "v2")
    assert out.ops == [ClearOp(None, 30.0, 40.0, CloseReason.RESTART)]
    assert sorted(out.closed) == [Closed("acme", "CPU", 20.0, False), Closed("acme", "GPU", 30.0, False)]
    assert set(state.resident("s")) == {("GPU", 3)}


def test_a_lost_source_closes_everything() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(10.0, stored([1], ACME_2)), "v")
    out = state.close_source("s", SourceEnd(CloseReason.LOST, 12.0, None, 50.0), "v")
    assert out.ops == [ClearOp(None, None, 50.0, CloseReason.LOST)]
    assert out.closed == [Closed("acme", "GPU", 40.0, False)]
    assert state.close_source("never-seen", SourceEnd(CloseReason.LOST, 1.0, None, 2.0), "v").closed == []


def test_sources_are_separate() -> None:
    state = LedgerState(index())
    state.apply("a", 0, batch(1.0, stored([1], ACME_2)), "v")
    state.apply("b", 0, batch(1.0, stored([1], ACME_2)), "v")
    out = state.apply("a", 1, batch(2.0, BlockRemoved([1])), "v")
    assert out.closed == [Closed("acme", "GPU", 1.0, False)]
    assert set(state.resident("b")) == {("GPU", 1)}
    assert state.resident_counts[("acme", "GPU")] == 1


def test_load_resumes_resident_blocks_and_their_owners() -> None:
    state = LedgerState(index())
    rows = [OpenBlock("s", "GPU", 1, "acme", 2, 5.0), OpenBlock("s", "GPU", 1, "acme", 2, 5.0),
            OpenBlock("s", "CPU", 9, "unattributed", None, 6.0)]
    state.load(rows)
    assert state.resident_counts == Counter({("acme", "GPU"): 1, ("unattributed", "CPU"): 1})
    assert state.owners.get(1) == ACME  # attribution asks the resident blocks first
    assert state.owners.get(9) is None
    child = state.apply("s", 0, batch(8.0, stored([2], parent=1)), "v")
    assert child.ops == [OpenOp("GPU", 2, 1, "acme", 2, 8.0)]
    assert state.apply("s", 1, batch(9.0, BlockRemoved([1])), "v").closed == [Closed("acme", "GPU", 4.0, False)]


def test_overdue_blocks_are_flagged_once_and_close_flagged() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(100.0, stored([1], ACME_2), stored([2], GLOBEX_1)), "v")
    state.apply("s", 1, batch(150.0, stored([3], ACME_2, parent=None)), "v")
    retention = {"acme": 60.0}
    assert list(state.flag_overdue(160.0, retention)) == [Counter()]  # exactly at the limit: not yet
    assert list(state.flag_overdue(160.5, retention)) == [Counter({"acme": 1})]
    assert list(state.flag_overdue(500.0, retention)) == [Counter({"acme": 1})]  # block 3 now; 1 not again
    assert list(state.flag_overdue(900.0, retention)) == [Counter()]
    out = state.apply("s", 2, batch(1000.0, BlockRemoved([1, 2])), "v")
    assert out.closed == [Closed("acme", "GPU", 900.0, True), Closed("globex", "GPU", 900.0, False)]


def test_the_sweep_yields_a_chunk_at_a_time() -> None:
    state = LedgerState(index())
    hashes = list(range(SWEEP_CHUNK + 1))
    state.apply("s", 0, batch(0.0, stored(hashes, ACME_2)), "v")
    chunks = list(state.flag_overdue(10.0, {"acme": 1.0}))
    assert chunks == [Counter({"acme": SWEEP_CHUNK}), Counter({"acme": 1})]
    assert list(state.flag_overdue(10.0, {})) == [Counter(), Counter()]


def test_chain_attribution_reaches_children_in_a_later_batch() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(1.0, stored([1, 2], ACME_2)), "v")
    out = state.apply("s", 1, batch(2.0, stored([3], parent=2), stored([7], parent=70)), "v")
    assert out.ops == [OpenOp("GPU", 3, 2, "acme", 2, 2.0), OpenOp("GPU", 7, 70, "unattributed", None, 2.0)]


def test_digest_helper_matches_hashlib() -> None:
    assert salt_digest(ACME_2) == hashlib.sha256(ACME_2.encode()).digest()[:16]


def test_three_copies_need_three_removals() -> None:
    state = LedgerState(index())
    for seq in range(3):
        state.apply("s", seq, batch(float(seq), stored([1], ACME_2)), "v")
    assert state.apply("s", 3, batch(10.0, BlockRemoved([1])), "v").ops == [CopiesOp("GPU", 1, 2)]
    assert state.apply("s", 4, batch(11.0, BlockRemoved([1])), "v").ops == [CopiesOp("GPU", 1, 1)]
    assert state.apply("s", 5, batch(12.0, BlockRemoved([1])), "v").ops == [CloseOp("GPU", 1, 12.0)]


def test_a_removal_of_a_duplicate_does_not_stop_the_rest_of_the_event() -> None:
    state = LedgerState(index())
    state.apply("s", 0, batch(1.0, stored([1, 2], ACME_2), stored([1], ACME_2)), "v")
    out = state.apply("s", 1, batch(2.0, BlockRemoved([1, 2])), "v")
    assert out.ops == [CopiesOp("GPU", 1, 1), CloseOp("GPU", 2, 2.0)]


def test_load_counts_every_distinct_block() -> None:
    state = LedgerState(index())
    state.load([OpenBlock("s", "GPU", 1, "acme", 2, 5.0), OpenBlock("s", "GPU", 2, "acme", 2, 5.0),
                OpenBlock("t", "GPU", 1, "acme", 2, 5.0)])
    assert state.resident_counts == Counter({("acme", "GPU"): 3})


def test_an_empty_index_takes_users_without_tenants() -> None:
    entry = SaltDigestEntry("acme", 0, salt_digest("lonely"))
    salts = SaltIndex(remembered())
    salts.add_users([entry])
    assert salts.match(["lonely"]) is None
    assert salts.users() == [entry]
    assert len(salts) == 1  # no tenant salts derived; the one remembered user
