"""The lmcache format's decoder, state machine by state machine: medium names, the prefix arithmetic, the trimming
of vLLM's one extra relayed token, which GPU chain owns a chunk (or none), per-owner hashes and the removals that
close every owner's record, the fallback for payloads the typed path refuses, and the bounded memory per source."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kvevents.formats import lmcache
from gateway.kvevents.formats.base import decoder_for
from gateway.kvevents.formats.lmcache import LMCacheDecoder, extend, lmcache_medium, owned_hash
from gateway.kvevents.wire import AllBlocksCleared, BatchDecoder, BlockRemoved, BlockStored, EventBatch, WireError

BLOCK = 4  # GPU block size of these hand-built streams
TOKENS = list(range(100, 116))  # 16 tokens: 4 GPU blocks, 2 LMCache chunks of 8


def gpu(hashes: list[int], tokens: list[int], parent: int | None = None, salt: str | None = "salt-a",
        block_size: int | None = BLOCK) -> dict[str, Any]:
    extra: list[Any] | None = None if salt is None else [[salt]] + [None] * (len(hashes) - 1)
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": block_size, "medium": "GPU", "extra_keys": extra}


def chunk(chunk_hash: int, tokens: list[int], parent: int | None = None, medium: str = "cpu") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [chunk_hash], "parent_block_hash": parent, "token_ids": tokens,
            "block_size": 8, "medium": medium}


def removed(hashes: list[int], medium: str | None = "cpu") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}


def batch(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([7.5, list(events), None])


def last(decoder: LMCacheDecoder, *events: dict[str, Any]) -> Any:
    return decoder.decode(batch(*events)).events[-1]


def sha_oracle(encoded_pair: bytes) -> int:
    return int.from_bytes(hashlib.sha256(encoded_pair).digest()[:8], "big")


# --- names and arithmetic ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "medium"), [
    (None, "CPU"), ("", "CPU"), ("cpu", "CPU"), ("CPU", "CPU"), ("LocalCPUBackend", "CPU"), ("pinned", "CPU"),
    ("local_disk", "DISK"), ("LocalDiskBackend", "DISK"), ("GdsBackend", "DISK"), ("NVMe", "DISK"), ("fs", "DISK"),
    ("Redis", "REMOTE"), ("valkey", "REMOTE"), ("S3", "REMOTE"), ("nixl", "REMOTE"), ("mooncake", "REMOTE"),
    ("tape", "TAPE"), ("Ünïcode", "ÜNÏCODE"), ("gpu", "GPU"),
])
def test_lmcache_medium_names_map_onto_the_policy_vocabulary(name: str | None, medium: str) -> None:
    assert lmcache_medium(name) == medium


def test_an_empty_token_run_leaves_the_prefix_alone() -> None:
    assert extend((123, 5), [], BLOCK) == (123, 5)


def test_the_prefix_length_counts_tokens_not_blocks() -> None:
    assert extend((0, 0), list(range(10)), BLOCK)[1] == 10


@settings(max_examples=60, deadline=None)
@given(blocks_a=st.integers(0, 4), tail=st.lists(st.integers(0, 2**31), max_size=12), block=st.integers(1, 5))
def test_a_prefix_extended_in_two_block_aligned_steps_equals_one_step(blocks_a: int, tail: list[int],
                                                                     block: int) -> None:
    head = list(range(blocks_a * block))
    assert extend(extend((0, 0), head, block), tail, block) == extend((0, 0), head + tail, block)


def test_prefixes_of_different_tokens_or_starts_differ() -> None:
    base = extend((0, 0), [1, 2, 3, 4], BLOCK)
    assert base != extend((0, 0), [1, 2, 3, 5], BLOCK)
    assert base != extend((1, 0), [1, 2, 3, 4], BLOCK)
    assert extend((0, 0), [1, 2, 3, 4], 2) != base  # the block size is part of the chain


@pytest.mark.parametrize(("root", "chunk_hash", "encoded"), [
    ("salt-a", 7, b"\x92\xa6salt-a\x07"),  # fixarray(2), fixstr(6), positive fixint
    (["salt-a"], 7, b"\x92\x91\xa6salt-a\x07"),
    ("s", 2**64 - 1, b"\x92\xa1s\xcf" + b"\xff" * 8),  # uint64
    ("s", b"\x01\x02", b"\x92\xa1s\xc4\x02\x01\x02"),  # bin8
    (None, 0, b"\x92\xc0\x00"),
])
def test_an_owned_hash_is_the_first_8_bytes_of_sha256_of_the_msgpack_pair(root: Any, chunk_hash: int | bytes,
                                                                           encoded: bytes) -> None:
    assert owned_hash(root, chunk_hash) == sha_oracle(encoded)


def test_owned_hashes_differ_per_owner_and_fit_in_64_bits() -> None:
    hashes = {owned_hash([f"salt-{n}"], 7) for n in range(50)}
    assert len(hashes) == 50
    assert all(0 <= value < 2**64 for value in hashes)


# --- which chain owns a chunk -------------------------------------------------------------------------------------


def test_a_chunk_whose_tokens_a_gpu_chain_held_is_owned_by_that_chains_salt() -> None:
    decoder = LMCacheDecoder()
    event = last(decoder, gpu([1, 2, 3, 4], TOKENS), chunk(70, TOKENS[:8]))
    assert event == BlockStored([owned_hash(["salt-a"], 70)], None, "CPU", [["salt-a"]])


def test_vllms_one_extra_relayed_token_is_not_part_of_the_chunk() -> None:
    decoder = LMCacheDecoder()
    event = last(decoder, gpu([1, 2, 3, 4], TOKENS), chunk(70, TOKENS[:9]))  # block_size 8, nine token ids
    assert event.extra_keys == [["salt-a"]]


def test_a_chunk_chained_to_an_earlier_chunk_continues_its_prefix() -> None:
    decoder = LMCacheDecoder()
    decoder.decode(batch(gpu([1, 2, 3, 4], TOKENS), chunk(70, TOKENS[:8])))
    event = last(decoder, chunk(71, TOKENS[8:], parent=70, medium="LocalDiskBackend"))
    assert event == BlockStored([owned_hash(["salt-a"], 71)], None, "DISK", [["salt-a"]])


def test_a_gpu_chain_continued_in_a_later_batch_keeps_its_roots_salt() -> None:
    decoder = LMCacheDecoder()
    decoder.decode(batch(gpu([1, 2], TOKENS[:8])))
    decoder.decode(batch(gpu([3, 4], TOKENS[8:], parent=2, salt=None)))
    event = last(decoder, chunk(70, TOKENS[:8]), chunk(71, TOKENS[8:], parent=70))
    assert event.extra_keys == [["salt-a"]]


@pytest.mark.parametrize(("first", "second", "why"), [
    (gpu([1, 2], TOKENS[:8], parent=999), chunk(70, TOKENS[:8]), "the GPU chain's parent was never seen"),
    (gpu([1, 2], TOKENS[:8], salt=None), chunk(70, TOKENS[:8]), "the chain's root carries no salt"),
    ({**gpu([1, 2], TOKENS[:8]), "token_ids": None}, chunk(70, TOKENS[:8]), "the GPU event has no token ids"),
    (gpu([1, 2], TOKENS[:8], block_size=None), chunk(70, TOKENS[:8]), "the GPU event has no block size"),
    (gpu([1, 2], TOKENS[:8]), chunk(70, [9] * 8), "other tokens"),
    (gpu([1, 2], TOKENS[:8]), chunk(70, TOKENS[8:], parent=12345), "an unknown parent, a first block never held"),
    (gpu([1, 2], TOKENS[:8]), chunk(70, TOKENS[1:9]), "the same tokens shifted by one"),
    (gpu([1, 2], TOKENS[:8]), chunk(70, []), "no token ids"),
], ids=lambda value: value if isinstance(value, str) else "")
def test_a_chunk_no_salted_gpu_chain_held_stays_unattributed(first: dict[str, Any], second: dict[str, Any],
                                                             why: str) -> None:
    event = last(LMCacheDecoder(), first, second)
    assert event == BlockStored([70], None, "CPU", None), why


def test_before_any_gpu_block_size_is_known_no_chunk_is_attributed() -> None:
    assert last(LMCacheDecoder(), chunk(70, TOKENS[:8])) == BlockStored([70], None, "CPU", None)


def test_a_chunk_after_a_parent_zero_gap_is_placed_by_its_first_gpu_block() -> None:
    decoder = LMCacheDecoder()
    event = last(decoder, gpu([1, 2, 3, 4], TOKENS), chunk(71, TOKENS[8:], parent=0))
    assert event.extra_keys == [["salt-a"]]


def test_the_chain_that_last_held_a_prefix_is_named() -> None:
    decoder = LMCacheDecoder()
    decoder.decode(batch(gpu([1, 2], TOKENS[:8], salt="salt-a"), gpu([5, 6], TOKENS[:8], salt="salt-b")))
    assert last(decoder, chunk(70, TOKENS[:8])).extra_keys == [["salt-b"]]


def test_chunk_hashes_are_kept_apart_per_owner_and_gpu_events_pass_through() -> None:
    decoder = LMCacheDecoder()
    first = decoder.decode(batch(gpu([1, 2], TOKENS[:8], salt="salt-a"), chunk(70, TOKENS[:8]))).events
    second = decoder.decode(batch(gpu([5, 6], TOKENS[:8], salt="salt-b"), chunk(70, TOKENS[:8]))).events
    assert first[0] == BlockStored([1, 2], None, "GPU", [["salt-a"], None])
    assert first[1].block_hashes != second[1].block_hashes  # type: ignore[union-attr]


# --- removals ------------------------------------------------------------------------------------------------------


def test_removing_a_chunk_stored_by_two_owners_closes_both_records_once() -> None:
    decoder = LMCacheDecoder()
    decoder.decode(batch(gpu([1, 2], TOKENS[:8], salt="salt-a"), chunk(70, TOKENS[:8])))
    decoder.decode(batch(chunk(70, TOKENS[:8])))  # the same owner again: no second record
    decoder.decode(batch(gpu([5, 6], TOKENS[:8], salt="salt-b"), chunk(70, TOKENS[:8])))
    event = last(decoder, removed([70], "LocalCPUBackend"))
    assert event == BlockRemoved([owned_hash(["salt-a"], 70), owned_hash(["salt-b"], 70)], "CPU")
    # the records are closed: a second removal of the same hash names only the hash itself
    assert last(decoder, removed([70])) == BlockRemoved([70], "CPU")


def test_an_unattributed_chunk_is_removed_by_its_own_hash() -> None:
    decoder = LMCacheDecoder()
    decoder.decode(batch(chunk(70, TOKENS[:8])))
    assert last(decoder, removed([70, 71], "remote")) == BlockRemoved([70, 71], "REMOTE")


@pytest.mark.parametrize("medium", [None, "GPU"])
def test_gpu_removals_and_clears_pass_through_unchanged(medium: str | None) -> None:
    events = LMCacheDecoder().decode(batch(removed([1, 2], medium), {"type": "AllBlocksCleared"})).events
    assert events == [BlockRemoved([1, 2], medium), AllBlocksCleared()]


# --- what the typed path refuses -----------------------------------------------------------------------------------


def test_a_map_event_only_vllms_decoding_can_read_is_kept_without_attribution() -> None:
    odd = {**chunk(71, TOKENS[:8]), "token_ids": "not ids"}
    events = LMCacheDecoder().decode(batch(gpu([1, 2], TOKENS[:8]), odd)).events
    assert events[-1] == BlockStored([71], None, "cpu")


def test_array_encoded_payloads_fall_back_to_the_plain_vllm_decoding() -> None:
    payload = msgspec.msgpack.encode([3.0, [["BlockStored", [70], None, [1, 2], 8, None, "cpu"]]])
    assert LMCacheDecoder().decode(payload) == BatchDecoder().decode(payload)
    assert LMCacheDecoder().decode(payload) == EventBatch(3.0, [BlockStored([70], None, "cpu")], 0)


@pytest.mark.parametrize("odd_event", [{"type": "SomethingNew"}, {"type": "BlockStored", "block_hashes": "x"},
                                       ["NewArrayType", [1]], "not an event"])
def test_one_event_the_decoder_cannot_read_costs_only_itself(odd_event: Any) -> None:
    """Wrong version: one unknown event sends the whole batch to the plain vLLM decoding, so its chunks lose their
    owner and keep LMCache's raw medium names (a disk chunk reported on medium LOCALDISKBACKEND)."""
    payload = batch(gpu([1, 2], TOKENS[:8]), odd_event, chunk(70, TOKENS[:8], medium="LocalDiskBackend"))
    events = LMCacheDecoder().decode(payload)
    assert events == EventBatch(7.5, [BlockStored([1, 2], None, "GPU", [["salt-a"], None]),
                                      BlockStored([owned_hash(["salt-a"], 70)], None, "DISK", [["salt-a"]])], 1)


@pytest.mark.parametrize("payload", [b"", b"\xc1", msgspec.msgpack.encode({"ts": 1})])
def test_a_payload_that_is_not_a_batch_raises_the_wire_error(payload: bytes) -> None:
    with pytest.raises(WireError):
        LMCacheDecoder().decode(payload)


def test_memory_per_source_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lmcache, "PREFIX_CAPACITY", 2)
    decoder = LMCacheDecoder()
    decoder.decode(batch(gpu([1, 2], TOKENS[:8], salt="salt-a")))
    decoder.decode(batch(gpu([11, 12], [7] * 8, salt="salt-b")))  # pushes salt-a's prefixes out
    assert last(decoder, chunk(70, TOKENS[:8])).extra_keys is None
    assert last(decoder, chunk(71, [7] * 8)).extra_keys == [["salt-b"]]


# --- choosing a format ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "kind"), [("vllm", BatchDecoder), ("lmcache", LMCacheDecoder)])
def test_formats_are_chosen_by_name_and_each_call_is_a_fresh_decoder(name: str, kind: type[object]) -> None:
    first, second = decoder_for(name), decoder_for(name)
    assert isinstance(first, kind) and first is not second


@pytest.mark.parametrize("name", ["", "VLLM", "LMCache", "json", "vllm "])
def test_an_unknown_format_name_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError, match=f"unknown KV-event format {name!r}"):
        decoder_for(name)


def test_decoders_of_two_sources_keep_their_state_apart() -> None:
    one, other = decoder_for("lmcache"), decoder_for("lmcache")
    one.decode(batch(gpu([1, 2], TOKENS[:8])))
    assert other.decode(batch(chunk(70, TOKENS[:8]))).events[-1] == BlockStored([70], None, "CPU", None)
    assert one.decode(batch(chunk(70, TOKENS[:8]))).events[-1].extra_keys == [["salt-a"]]  # type: ignore[union-attr]
