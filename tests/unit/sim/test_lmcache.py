"""LMCache in-process mode (pure): the cache identity (tags, salt, the ignore-salt defect), lookups, stores,
skip_save, silent LRU eviction, and the events, checked against a real LMCache 0.5.6 capture."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from gateway.sim.config import SimConfig
from gateway.sim.hashing import chain_hashes
from gateway.sim.lmcache import LMCacheConnector, identity, lmcache_entries
from tests.unit.sim.captures import decode_payload, kv_event_frames

PROMPT = list(range(1000, 1000 + 128))  # two 64-token chunks


def connector(chunks: int = 16, events: bool = True, **overrides: Any) -> LMCacheConnector:
    config = SimConfig(lmcache=True, lmcache_chunk_size=64, lmcache_chunks=chunks, **overrides)
    return LMCacheConnector(config, events)


def body(**params: Any) -> dict[str, Any]:
    return {"kv_transfer_params": params} if params else {}


@pytest.mark.parametrize(
    ("request_body", "entries"),
    [
        ({}, {}),
        ({"kv_transfer_params": None}, {}),
        ({"kv_transfer_params": "abc"}, {}),
        ({"kv_transfer_params": []}, {}),
        ({"kv_transfer_params": {"max_load_tokens": 5, "lmcache.tag.user": "u"}}, {"lmcache.tag.user": "u"}),
        ({"kv_transfer_params": {"lmcache.skip_save": True, "lmcachex": 1}}, {"lmcache.skip_save": True}),
    ],
)
def test_only_the_lmcache_entries_of_kv_transfer_params_count(request_body: dict[str, Any],
                                                              entries: dict[str, Any]) -> None:
    assert lmcache_entries(request_body) == entries


@pytest.mark.parametrize(
    ("first", "second", "same"),
    [
        (({}, None, False), ({}, None, False), True),
        (({}, "s1", False), ({}, "s1", False), True),
        (({}, "s1", False), ({}, "s2", False), False),
        (({}, "s1", False), ({}, None, False), False),
        (({}, "s1", True), ({}, "s2", True), True),  # the ignore-salt defect: two salts, one identity
        (({}, "", False), ({}, None, False), True),  # an empty salt is no salt
        (({"lmcache.tag.a": "x", "lmcache.tag.b": "y"}, None, False),
         ({"lmcache.tag.b": "y", "lmcache.tag.a": "x"}, None, False), True),  # tag order does not matter
        (({"lmcache.tag.a": "x", "lmcache.skip_save": True}, None, False),
         ({"lmcache.tag.a": "x"}, None, False), True),  # only tags count
        (({"lmcache.tag.a": "x"}, None, False), ({"lmcache.tag.a": "y"}, None, False), False),
        (({"lmcache.tag.a": "x"}, None, False), ({"lmcache.tag.b": "x"}, None, False), False),
        # Identities a joined "name%value@..." string could not tell apart:
        (({"lmcache.tag.salt": "s"}, None, False), ({}, "s", False), False),
        (({"lmcache.tag.a": "x@salt%s"}, None, False), ({"lmcache.tag.a": "x"}, "s", False), False),
        (({"lmcache.tag.a%b": "c"}, None, False), ({"lmcache.tag.a": "b%c"}, None, False), False),
        (({"lmcache.tag.a": "x@b%y"}, None, False), ({"lmcache.tag.a": "x", "lmcache.tag.b": "y"}, None, False),
         False),
    ],
)
def test_identity_is_the_tags_and_the_salt(first: tuple[dict[str, Any], str | None, bool],
                                           second: tuple[dict[str, Any], str | None, bool], same: bool) -> None:
    assert (identity(*first) == identity(*second)) is same


def test_a_tag_named_salt_cannot_reach_a_salted_tenants_entries() -> None:
    tier = connector()
    tier.store(PROMPT, {}, "tenant-a")
    assert tier.hit_tokens(PROMPT, body(**{"lmcache.tag.salt": "tenant-a"}), None, 0) == 0
    assert tier.hit_tokens(PROMPT, {}, "tenant-a", 0) == 127


@pytest.mark.parametrize(("gpu_hit", "hit"), [(0, 127), (64, 63), (112, 15), (126, 1), (127, 0), (128, 0)])
def test_a_lookup_loads_the_stored_prefix_beyond_the_gpu_hit_but_never_the_last_token(gpu_hit: int,
                                                                                      hit: int) -> None:
    tier = connector()
    tier.store(PROMPT, {}, None)
    assert tier.hit_tokens(PROMPT, {}, None, gpu_hit) == hit


def test_a_longer_prompt_hits_whole_stored_chunks() -> None:
    tier = connector()
    tier.store(PROMPT, {}, None)
    assert tier.hit_tokens([*PROMPT, 5, 6], {}, None, 0) == 128
    assert tier.hit_tokens(PROMPT[:64] + [5] * 64, {}, None, 0) == 64  # the second chunk differs
    assert tier.hit_tokens([7, *PROMPT[1:]], {}, None, 0) == 0  # so does the first (prefix identity)


@pytest.mark.parametrize(
    ("stored_with", "looked_up_with", "ignore_salt", "hit"),
    [
        (("a", {}), ("a", {}), False, 127),
        (("a", {}), ("b", {}), False, 0),
        (("a", {}), (None, {}), False, 0),
        (("a", {}), ("b", {}), True, 127),  # the defect: two salts, one entry
        ((None, {"lmcache.tag.t": "1"}), (None, {"lmcache.tag.t": "1"}), False, 127),
        ((None, {"lmcache.tag.t": "1"}), (None, {"lmcache.tag.t": "2"}), False, 0),
        ((None, {"lmcache.tag.t": "1"}), (None, {}), True, 0),  # tags count even when salts do not
        ((None, {"lmcache.skip_save": False}), (None, {}), False, 127),  # not a tag: same identity
    ],
)
def test_salts_and_tags_separate_entries(stored_with: tuple[str | None, dict[str, Any]],
                                         looked_up_with: tuple[str | None, dict[str, Any]], ignore_salt: bool,
                                         hit: int) -> None:
    tier = connector(lmcache_ignore_salt=ignore_salt)
    tier.store(PROMPT, body(**stored_with[1]), stored_with[0])
    assert tier.hit_tokens(PROMPT, body(**looked_up_with[1]), looked_up_with[0], 0) == hit


def test_skip_save_stores_nothing() -> None:
    tier = connector()
    assert tier.store(PROMPT, body(**{"lmcache.skip_save": True}), None) == []
    assert (len(tier), tier.stored_tokens_total) == (0, 0)
    tier.store(PROMPT, body(**{"lmcache.skip_save": "yes"}), None)  # only a JSON true skips
    assert len(tier) == 2


def test_only_full_chunks_are_stored_and_a_repeat_stores_nothing_new() -> None:
    tier = connector()
    assert len(tier.store(PROMPT + [1] * 63, {}, None)) == 2
    assert tier.store(PROMPT, {}, None) == []
    assert (len(tier), tier.stored_tokens_total) == (2, 128)
    assert tier.store(PROMPT[:63], {}, None) == []


def test_events_carry_the_token_only_chain_whatever_the_identity() -> None:
    """LMCache's hash has no tag or salt: two tenants storing one prefix send the same hashes."""
    first = connector().store(PROMPT, {}, "tenant-a")
    second = connector().store(PROMPT, body(**{"lmcache.tag.x": "y"}), "tenant-b")
    expected = chain_hashes(PROMPT, 64, None)
    assert [e["block_hashes"] for e in first] == [[h] for h in expected] == [e["block_hashes"] for e in second]
    assert [e["parent_block_hash"] for e in first] == [None, expected[0]]
    assert all(e["medium"] == "cpu" and e["block_size"] == 64 and "extra_keys" not in e for e in first)


def test_event_tokens_run_one_into_the_next_stored_chunk() -> None:
    events = connector().store(PROMPT + [9] * 70, {}, None)  # three full chunks, six tokens beyond
    assert [len(e["token_ids"]) for e in events] == [65, 65, 64]
    assert [e["token_ids"][0] for e in events] == [PROMPT[0], PROMPT[64], 9]
    assert events[0]["token_ids"][-1] == PROMPT[64]


def test_the_medium_is_configurable() -> None:
    (event, _) = connector(lmcache_medium="disk").store(PROMPT, {}, None)
    assert event["medium"] == "disk"


def test_eviction_is_silent_and_least_recently_used() -> None:
    tier = connector(chunks=2)
    tier.store(PROMPT, {}, None)
    tier.load(PROMPT, {}, None, 64)  # touches the first chunk only
    other = list(range(5000, 5064))
    assert len(tier.store(other, {}, None)) == 1  # a store event, and no removal event for the evicted chunk
    assert len(tier) == 2
    assert tier.hit_tokens(PROMPT, {}, None, 0) == 64  # the second chunk went; the touched first stayed
    assert tier.hit_tokens(other, {}, None, 0) == 63


def test_load_counts_the_tokens_and_clear_forgets_everything() -> None:
    tier = connector()
    tier.store(PROMPT, {}, None)
    tier.load(PROMPT, {}, None, 100)
    tier.load(PROMPT, {}, None, 27)
    assert tier.hit_tokens_total == 127
    tier.clear()
    assert (len(tier), tier.hit_tokens(PROMPT, {}, None, 0)) == (0, 0)


def test_without_events_a_store_still_stores() -> None:
    tier = connector(events=False)
    assert tier.store(PROMPT, {}, None) == []
    assert len(tier) == 2 and tier.stored_tokens_total == 128


def test_chunk_events_have_the_shape_of_the_real_lmcache_capture() -> None:
    """Fed the captured request's 8000 prompt tokens, the simulator's 31 chunk events carry exactly the captured
    token_ids (257 ids, the last chunk 256), block_size, medium and parent links; only hash values differ."""
    frames = kv_event_frames("lmcache")
    _, events, _ = decode_payload(frames[0][2])
    (gpu,) = [e for e in events if e["medium"] == "GPU"]
    captured = [e for e in events if e["medium"] == "cpu"]
    config = SimConfig(lmcache=True, lmcache_chunk_size=256)
    simulated = LMCacheConnector(config, True).store(gpu["token_ids"], {}, None)
    assert [list(e) for e in simulated] == [list(e) for e in captured]
    assert [e["token_ids"] for e in simulated] == [e["token_ids"] for e in captured]
    assert [(e["block_size"], e["medium"], e["lora_id"]) for e in simulated] == [
        (e["block_size"], e["medium"], e["lora_id"]) for e in captured]
    for events_of in (simulated, captured):
        assert events_of[0]["parent_block_hash"] is None
        assert all(b["parent_block_hash"] == a["block_hashes"][0] for a, b in itertools.pairwise(events_of))
