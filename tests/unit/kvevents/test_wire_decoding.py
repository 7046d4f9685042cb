"""vLLM's KV-event wire format decoded directly: every field shape of both encodings (tagged maps and the older
positional arrays), the frames around a payload, and each malformed input mapped to its WireError or to a
counted skip. Payloads are built by hand with msgspec's encoder, so the expected events are the literals below."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kvevents.wire import (
    END_OF_REPLAY,
    SEQ_BYTES,
    AllBlocksCleared,
    BatchDecoder,
    BlockRemoved,
    BlockStored,
    Envelope,
    EventBatch,
    WireError,
    normalize_medium,
    open_envelope,
    parse_seq,
    replay_request,
)

UINT64_MAX = 2**64 - 1
INT64_MIN = -(2**63)


def encode(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def decode(value: Any) -> EventBatch:
    return BatchDecoder().decode(encode(value))


def stored_map(**fields: Any) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [1], **fields}


# --- tagged maps (current vLLM) ------------------------------------------------------------------------------


@pytest.mark.parametrize(("event", "expected"), [
    (stored_map(), BlockStored([1])),
    (stored_map(parent_block_hash=7, medium="GPU"), BlockStored([1], 7, "GPU")),
    (stored_map(parent_block_hash=None, medium="CPU", extra_keys=[["salt"], None]),
     BlockStored([1], None, "CPU", [["salt"], None])),
    # fields the ledger does not read are skipped, whatever their type
    (stored_map(token_ids=[1, 2, 3], block_size=16, lora_id=None, lora_name="x", future_field={"a": [1]}),
     BlockStored([1])),
    ({"type": "BlockStored", "block_hashes": [b"\x00\x01", 5, b""]}, BlockStored([b"\x00\x01", 5, b""])),
    ({"type": "BlockStored", "block_hashes": []}, BlockStored([])),
    ({"type": "BlockRemoved", "block_hashes": [3, 4]}, BlockRemoved([3, 4])),
    ({"type": "BlockRemoved", "block_hashes": [3], "medium": "CPU"}, BlockRemoved([3], "CPU")),
    ({"type": "AllBlocksCleared"}, AllBlocksCleared()),
    ({"type": "AllBlocksCleared", "medium": "GPU"}, AllBlocksCleared()),
], ids=["bare", "parent-and-medium", "extra-keys", "ignored-fields", "bytes-hashes", "no-hashes", "removed",
        "removed-medium", "cleared", "cleared-extra"])
def test_each_map_event_shape_decodes_to_its_event(event: dict[str, Any], expected: object) -> None:
    batch = decode([12.5, [event], 0])
    assert batch == EventBatch(ts=12.5, events=[expected], skipped=0)  # type: ignore[list-item]


@pytest.mark.parametrize("block_hash", [0, 1, UINT64_MAX, INT64_MIN, -1, b"\xff" * 32])
def test_hash_values_keep_their_full_range(block_hash: int | bytes) -> None:
    (event,) = decode([1.0, [stored_map(block_hashes=[block_hash], parent_block_hash=block_hash)]]).events
    assert event == BlockStored([block_hash], block_hash)


@pytest.mark.parametrize(("envelope", "ts"), [
    ([3, []], 3.0),  # an integer time is a number too
    ([3.25, [], None], 3.25),  # no data-parallel rank
    ([3.25, [], 7], 3.25),
    ([3.25, [], 7, "a field a newer vLLM appended"], 3.25),
    ([0.0, []], 0.0),
    ([1.7e9, []], 1.7e9),
])
def test_the_batch_envelope_accepts_every_shape_vllm_sent(envelope: list[Any], ts: float) -> None:
    assert decode(envelope) == EventBatch(ts=ts, events=[], skipped=0)


def test_events_keep_their_order_within_a_batch() -> None:
    events = [stored_map(block_hashes=[1]), {"type": "BlockRemoved", "block_hashes": [1]},
              {"type": "AllBlocksCleared"}, stored_map(block_hashes=[2], parent_block_hash=1)]
    assert decode([1.0, events]).events == [BlockStored([1]), BlockRemoved([1]), AllBlocksCleared(),
                                            BlockStored([2], 1)]


# --- positional arrays (older vLLM) ----------------------------------------------------------------------------


@pytest.mark.parametrize(("event", "expected"), [
    (["BlockStored", [1, 2]], BlockStored([1, 2])),
    (["BlockStored", [1], 9], BlockStored([1], 9)),
    # block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name, extra_keys
    (["BlockStored", [1], None, [5, 6], 16, None, "CPU", None, [["salt"]]], BlockStored([1], None, "CPU", [["salt"]])),
    (["BlockStored", [1], None, [5, 6], 16, 3, None], BlockStored([1])),
    (["BlockRemoved", [4]], BlockRemoved([4])),
    (["BlockRemoved", [4], "GPU"], BlockRemoved([4], "GPU")),
    (["AllBlocksCleared"], AllBlocksCleared()),
], ids=["hashes-only", "parent", "all-fields", "lora", "removed", "removed-medium", "cleared"])
def test_each_array_event_shape_decodes_to_the_same_event_as_a_map(event: list[Any], expected: object) -> None:
    assert decode([2.0, [event]]) == EventBatch(ts=2.0, events=[expected], skipped=0)  # type: ignore[list-item]


def test_arrays_and_maps_mix_in_one_batch() -> None:
    batch = decode([2.0, [["BlockStored", [1]], {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"}]])
    assert batch.events == [BlockStored([1]), BlockRemoved([1], "CPU")]
    assert batch.skipped == 0


# --- skipped events: counted, never fatal ------------------------------------------------------------------------


@pytest.mark.parametrize("bad_event", [
    {"type": "BlockMovedToTheMoon", "block_hashes": [1]},  # a type from a newer vLLM
    {"block_hashes": [1]},  # no tag
    {"type": "BlockStored"},  # no hashes
    {"type": "BlockStored", "block_hashes": "1"},
    {"type": "BlockStored", "block_hashes": [1.5]},  # a float is not a hash
    {"type": "BlockStored", "block_hashes": [None]},
    {"type": "BlockStored", "block_hashes": [1], "medium": 5},
    {"type": "BlockStored", "block_hashes": [1], "extra_keys": "salt"},
    {"type": "BlockRemoved", "block_hashes": [1], "medium": ["CPU"]},
    ["NewArrayType", [1]],
    [],
    ["BlockStored"],  # positional hashes missing
    ["BlockStored", "not a list"],
    "BlockStored",
    17,
    None,
    True,
], ids=lambda value: repr(value)[:40])
def test_an_event_that_is_not_a_known_shape_is_skipped_and_counted(bad_event: Any) -> None:
    batch = decode([4.0, [stored_map(block_hashes=[10]), bad_event, {"type": "AllBlocksCleared"}]])
    assert batch == EventBatch(ts=4.0, events=[BlockStored([10]), AllBlocksCleared()], skipped=1)


def test_a_batch_of_only_unknown_events_is_empty_with_every_event_counted() -> None:
    batch = decode([4.0, [{"type": "A"}, {"type": "B"}, ["C"]]])
    assert batch == EventBatch(ts=4.0, events=[], skipped=3)


# --- payloads that are not a batch: a clear WireError -----------------------------------------------------------


@pytest.mark.parametrize(("payload", "message"), [
    (b"", "payload is not msgpack"),
    (b"\xc1", "payload is not msgpack"),  # the one opcode msgpack never uses
    (encode([1.0, [stored_map()]])[:-3], "payload is not msgpack"),  # truncated mid-event
    (b'{"ts": 1, "events": []}', "payload is not"),  # JSON is not msgpack
    (encode({"ts": 1.0, "events": []}), "payload is not a [ts, events, ...] array"),
    (encode([1.0]), "payload is not a [ts, events, ...] array"),
    (encode([]), "payload is not a [ts, events, ...] array"),
    (encode([1.0, "events"]), "payload is not a [ts, events, ...] array"),
    (encode([1.0, {"type": "AllBlocksCleared"}]), "payload is not a [ts, events, ...] array"),
    (encode("a string"), "payload is not a [ts, events, ...] array"),
    (encode(None), "payload is not a [ts, events, ...] array"),
    (encode(["1.0", []]), "batch timestamp is not a number"),
    (encode([None, []]), "batch timestamp is not a number"),
    (encode([True, []]), "batch timestamp is not a number"),  # a boolean is not a time
    (encode([[1.0], []]), "batch timestamp is not a number"),
], ids=["empty", "never-used-opcode", "truncated", "json", "map", "one-element", "empty-array", "events-string",
        "events-map", "string", "nil", "ts-string", "ts-nil", "ts-bool", "ts-array"])
def test_a_payload_that_is_not_a_batch_raises_a_wire_error_saying_why(payload: bytes, message: str) -> None:
    with pytest.raises(WireError) as raised:
        BatchDecoder().decode(payload)
    assert str(raised.value).startswith(message)


def test_one_decoder_serves_many_payloads_without_carrying_state() -> None:
    decoder = BatchDecoder()
    first = decoder.decode(encode([1.0, [{"type": "Unknown"}]]))
    with pytest.raises(WireError):
        decoder.decode(b"\xc1")
    second = decoder.decode(encode([2.0, [stored_map()]]))
    assert (first.skipped, second) == (1, EventBatch(2.0, [BlockStored([1])], 0))


HASHES = st.lists(st.one_of(st.integers(INT64_MIN, UINT64_MAX), st.binary(max_size=40)), max_size=6)
MEDIA = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "STORAGE", "cpu", ""]))


@settings(max_examples=60, deadline=None)
@given(ts=st.floats(allow_nan=False, allow_infinity=False), hashes=HASHES,
       parent=st.one_of(st.none(), st.integers(0, UINT64_MAX)), medium=MEDIA, as_array=st.booleans())
def test_stored_events_round_trip_in_either_encoding(ts: float, hashes: list[int | bytes], parent: int | None,
                                                     medium: str | None, as_array: bool) -> None:
    event: Any = (["BlockStored", hashes, parent, None, None, None, medium] if as_array else
                  {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "medium": medium})
    assert decode([ts, [event]]) == EventBatch(ts, [BlockStored(hashes, parent, medium)], 0)


# --- frames around the payload ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("frame", "seq", "publisher"), [
    (b"\x00" * 8, 0, b""),
    (b"\x00" * 7 + b"\x01", 1, b""),
    (b"\x00\x00\x00\x00\x00\x00\x01\x00", 256, b""),
    (b"\x7f" + b"\xff" * 7, 2**63 - 1, b""),
    (b"\xff" * 8, END_OF_REPLAY, b""),  # the end-of-replay marker is -1, signed
    (b"\x80" + b"\x00" * 7, -(2**63), b""),
    (b"\x00" * 7 + b"\x05" + b"publisher-id-16b", 5, b"publisher-id-16b"),
    (b"\x00" * 7 + b"\x05" + b"x", 5, b"x"),
])
def test_a_sequence_frame_is_8_signed_big_endian_bytes_then_the_publisher(frame: bytes, seq: int,
                                                                            publisher: bytes) -> None:
    assert parse_seq(frame) == (seq, publisher)


@pytest.mark.parametrize("length", [0, 1, 7])
def test_a_short_sequence_frame_says_how_many_bytes_it_had(length: int) -> None:
    with pytest.raises(WireError, match=f"sequence frame has {length} bytes, expected at least {SEQ_BYTES}"):
        parse_seq(b"\x01" * length)


SEQ_9 = (9).to_bytes(8, "big")


@pytest.mark.parametrize(("frames", "expected"), [
    ([SEQ_9, b"payload"], Envelope(9, b"payload")),
    ([b"kv-events", SEQ_9, b"payload"], Envelope(9, b"payload")),  # live PUB message with a topic
    ([b"", SEQ_9, b"payload"], Envelope(9, b"payload")),  # replay reply seen by a DEALER
    ([b"", b"kv-events", SEQ_9, b"payload"], Envelope(9, b"payload")),  # replay reply with the topic kept
    ([b"", SEQ_9 + b"pub", b""], Envelope(9, b"", b"pub")),  # an empty payload is the decoder's problem
    ([b"", b"\xff" * 8, b""], Envelope(END_OF_REPLAY, b"")),
])
def test_the_sequence_is_the_frame_before_the_payload(frames: list[bytes], expected: Envelope) -> None:
    assert open_envelope(frames) == expected


@pytest.mark.parametrize(("frames", "message"), [
    ([], "message has 0 frames, expected at least 2"),
    ([b"payload"], "message has 1 frames, expected at least 2"),
    ([b"topic", b"short", b"payload"], "sequence frame has 5 bytes"),
])
def test_an_envelope_that_cannot_be_opened_raises_a_wire_error(frames: list[bytes], message: str) -> None:
    with pytest.raises(WireError, match=message):
        open_envelope(frames)


@pytest.mark.parametrize(("start", "frames"), [
    (0, [b"", b"\x00" * 8]),
    (1, [b"", b"\x00" * 7 + b"\x01"]),
    (258, [b"", b"\x00" * 6 + b"\x01\x02"]),
    (-5, [b"", b"\x00" * 8]),  # no batch before 0 exists: a negative start asks from the beginning
    (2**63 - 1, [b"", b"\x7f" + b"\xff" * 7]),
])
def test_a_replay_request_is_an_empty_delimiter_then_the_first_wanted_seq(start: int, frames: list[bytes]) -> None:
    assert replay_request(start) == frames


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**63 - 1))
def test_a_replay_request_names_the_seq_parse_seq_reads_back(start: int) -> None:
    assert parse_seq(replay_request(start)[1]) == (start, b"")


@pytest.mark.parametrize(("medium", "normal"), [
    (None, "GPU"),  # events from before vLLM named a medium were GPU blocks
    ("", "GPU"),
    ("GPU", "GPU"),
    ("CPU", "CPU"),
    ("cpu", "CPU"),
    ("Storage", "STORAGE"),
    ("disk", "DISK"),
])
def test_media_are_upper_cased_and_missing_means_gpu(medium: str | None, normal: str) -> None:
    assert normalize_medium(medium) == normal
