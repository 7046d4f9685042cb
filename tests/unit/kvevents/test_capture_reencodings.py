"""Real vLLM 0.25.0 payloads (tests/fixtures) re-serialised in every way a publisher may legally send them: events
as positional arrays (older vLLM), map keys in another order, fields a newer vLLM adds, float timestamps as
integers, and unknown event types mixed in. The decoding of the untouched capture is the oracle: every re-encoding
must decode to the same events, with the unknown ones skipped and counted."""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.kvevents.formats.lmcache import LMCacheDecoder
from gateway.kvevents.wire import BatchDecoder, EventBatch, WireError
from tests.kvevents.fixtures import captured

# Field order of vLLM's positional (array_like) encoding of each event type.
ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                    "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def payloads(server: str) -> list[bytes]:
    return [bytes(frames[-1]) for item in captured(server) if (frames := item.frames) is not None]


ALL = [(server, index, payload) for server in ("offload", "control", "cli")
       for index, payload in enumerate(payloads(server))]


def raw(payload: bytes) -> list[Any]:
    decoded: list[Any] = msgspec.msgpack.decode(payload)
    return decoded


def as_array(event: dict[str, Any]) -> list[Any]:
    return [event["type"], *(event.get(name) for name in ARRAY_FIELDS[event["type"]])]


def reencode(ts: Any, events: list[Any], *rest: Any) -> bytes:
    return msgspec.msgpack.encode([ts, events, *rest])


def test_the_captures_are_there_and_non_trivial() -> None:
    assert len(ALL) > 80
    kinds = {event["type"] for _, _, payload in ALL for event in raw(payload)[1]}
    assert kinds == {"BlockStored", "BlockRemoved"}


@pytest.mark.parametrize(("server", "index", "payload"), ALL, ids=[f"{s}-{i}" for s, i, _ in ALL])
def test_each_capture_decodes_the_same_as_positional_arrays(server: str, index: int, payload: bytes) -> None:
    ts, events, *rest = raw(payload)
    expected = BatchDecoder().decode(payload)
    assert expected.skipped == 0 and len(expected.events) == len(events)
    assert BatchDecoder().decode(reencode(ts, [as_array(event) for event in events], *rest)) == expected


@settings(max_examples=40, deadline=None)
@given(choice=st.integers(0, len(ALL) - 1), seed=st.integers(0, 2**32), extra=st.booleans(), int_ts=st.booleans(),
       drop_rank=st.booleans(), unknown_at=st.one_of(st.none(), st.integers(0, 50)))
def test_any_legal_reserialisation_decodes_to_the_captured_events(choice: int, seed: int, extra: bool, int_ts: bool,
                                                                  drop_rank: bool, unknown_at: int | None) -> None:
    payload = ALL[choice][2]
    ts, events, *rest = raw(payload)
    expected = BatchDecoder().decode(payload)
    shuffle = random.Random(seed)
    changed: list[Any] = []
    for event in events:
        items = list(event.items())
        shuffle.shuffle(items)  # msgpack maps carry no order
        if extra:
            items.append(("field_from_a_newer_vllm", {"nested": [1, 2, 3]}))
        changed.append(dict(items))
    skipped = 0
    if unknown_at is not None:
        changed.insert(min(unknown_at, len(changed)), {"type": "EventFromTheFuture", "block_hashes": [1]})
        skipped = 1
    new_ts = int(ts) if int_ts else ts
    decoded = BatchDecoder().decode(reencode(new_ts, changed, *([] if drop_rank else rest)))
    assert decoded == EventBatch(float(new_ts), expected.events, skipped)


@pytest.mark.parametrize(("server", "index", "payload"), ALL[:30], ids=[f"{s}-{i}" for s, i, _ in ALL[:30]])
def test_the_lmcache_format_reads_vllms_own_events_unchanged(server: str, index: int, payload: bytes) -> None:
    """On a stream with no LMCache chunks (GPU events and the OffloadingConnector's CPU placeholders, which carry
    no tokens) the lmcache format decodes exactly what the vllm format does."""
    assert LMCacheDecoder().decode(payload) == BatchDecoder().decode(payload)


def cuts(length: int) -> list[int]:
    """Every cut within the envelope and the first event, then 64 spread over the rest."""
    return sorted(set(range(1, min(length, 300))) | {1 + (length - 2) * n // 63 for n in range(64)} - {length})


def test_truncating_a_capture_anywhere_is_a_wire_error_never_a_wrong_batch() -> None:
    decoder = BatchDecoder()
    small = {len(payload): payload for _, _, payload in ALL}  # one capture of each size
    for payload in small.values():
        for cut in cuts(len(payload)):
            with pytest.raises(WireError):
                decoder.decode(payload[:cut])
