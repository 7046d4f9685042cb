"""The decoder against real vLLM 0.25.0 frames, and what `kv_events_counts.json` lets us check.

The captures are samples of longer runs (the first ~40 messages, then the first with CPU events), so the
full-run totals cannot be reproduced; what is checkable per server: sequence numbers lie within the run's
range and start at its first, the sample never exceeds a run total, payload sizes stay under the run's max,
the payload hashes match, and the per-event hash multiplicities the totals imply hold for every sampled event
(one hash per GPU BlockRemoved everywhere; one per CPU BlockStored placeholder on offload and cli, whose
totals have events == hashes; four per self-describing CPU BlockStored, 6016 / 1504).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import msgspec
import pytest

from gateway.kvevents.wire import (
    END_OF_REPLAY,
    AllBlocksCleared,
    BatchDecoder,
    BlockRemoved,
    BlockStored,
    KvEvent,
    normalize_medium,
    open_envelope,
    replay_request,
)
from tests.kvevents.fixtures import RUN_OF, SERVERS, captured, counts, replay_exchange

WITH_FRAMES = ("offload", "control", "cli")


def _payload(server: str, item: Any) -> bytes:
    frames = item.frames
    if frames is not None:
        return bytes(frames[-1])
    return msgspec.msgpack.encode(item.decoded)  # selfdesc has no frames: re-encode the decoded payload


def _type_medium(event: KvEvent) -> str:
    medium = getattr(event, "medium", None)
    return f"{type(event).__name__}/{normalize_medium(medium) if medium else None}"


def _expected_view(raw: dict[str, Any]) -> dict[str, Any]:
    view = {"type": raw["type"], "block_hashes": raw.get("block_hashes")}
    if raw["type"] == "BlockStored":
        view |= {"parent": raw["parent_block_hash"], "medium": raw["medium"], "extra_keys": raw.get("extra_keys")}
    elif raw["type"] == "BlockRemoved":
        view |= {"medium": raw["medium"]}
    return view


def _decoded_view(event: KvEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        return {"type": "BlockStored", "block_hashes": event.block_hashes, "parent": event.parent_block_hash,
                "medium": event.medium, "extra_keys": event.extra_keys}
    if isinstance(event, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": event.block_hashes, "medium": event.medium}
    assert isinstance(event, AllBlocksCleared)
    return {"type": "AllBlocksCleared", "block_hashes": None}


@pytest.mark.parametrize("server", WITH_FRAMES)
def test_real_frames_decode_to_the_captured_events(server: str) -> None:
    decoder = BatchDecoder()
    for item in captured(server):
        frames = item.frames
        assert frames is not None and len(frames) == 3
        envelope = open_envelope(frames)
        assert envelope.seq == item.seq
        assert hashlib.sha256(envelope.payload).hexdigest() == item.line["payload_sha256"]
        batch = decoder.decode(envelope.payload)
        assert batch.ts == item.decoded[0]
        assert batch.skipped == 0
        assert [_decoded_view(e) for e in batch.events] == [_expected_view(raw) for raw in item.decoded[1]]


@pytest.mark.parametrize("server", SERVERS)
def test_samples_agree_with_run_totals(server: str) -> None:
    run = counts()[RUN_OF[server]]
    items = captured(server)
    decoder = BatchDecoder()
    events: Counter[str] = Counter()
    hashes: Counter[str] = Counter()
    seqs = sorted({item.seq for item in items})
    assert seqs[0] == run["seq_first"] and seqs[-1] <= run["seq_last"]
    assert len(seqs) <= run["messages"]
    raw_events = 0
    for item in items:
        assert item.line["payload_len"] <= run["payload_len_max"]
        payload = _payload(server, item)
        raw_events += len(msgspec.msgpack.decode(payload)[1])  # counted without the product's decoder
        for event in decoder.decode(payload).events:
            events[_type_medium(event)] += 1
            hashes[_type_medium(event)] += len(getattr(event, "block_hashes", ()))
    assert raw_events > 0
    assert sum(events.values()) == raw_events  # a decoder that dropped events (or returned none) fails here
    for key, seen in events.items():
        assert seen <= run["events_by_type_medium"][key], key
        assert hashes[key] <= run["block_hashes_by_type_medium"][key], key


@pytest.mark.parametrize("server", SERVERS)
def test_hashes_per_event_match_what_the_totals_imply(server: str) -> None:
    run = counts()[RUN_OF[server]]
    decoder = BatchDecoder()
    per_event = {key: run["block_hashes_by_type_medium"][key] / run["events_by_type_medium"][key]
                 for key in run["events_by_type_medium"]}
    checked = 0
    for item in captured(server):
        for event in decoder.decode(_payload(server, item)).events:
            key = _type_medium(event)
            if per_event[key] in (1.0, 4.0):
                assert len(getattr(event, "block_hashes", ())) == per_event[key], (item.seq, key)
                checked += 1
    assert checked > 0 or all(ratio not in (1.0, 4.0) for ratio in per_event.values())


@pytest.mark.parametrize("server", ["offload", "control"])
def test_replay_exchange_decodes(server: str) -> None:
    exchange = replay_exchange(server)
    request = [bytes.fromhex(part) for part in exchange["request"]["frames_hex"]]
    assert request == replay_request(exchange["request"]["start_seq"])
    decoder = BatchDecoder()
    expected_seq = exchange["request"]["start_seq"]
    for reply in exchange["replies"]:
        frames = [bytes.fromhex(reply["frame0_hex"]), bytes.fromhex(reply["seq_hex"]),
                  bytes.fromhex(reply.get("payload_hex", ""))]
        envelope = open_envelope(frames)
        if envelope.seq == END_OF_REPLAY:
            assert reply is exchange["replies"][-1] and envelope.payload == b""
            continue
        assert envelope.seq == expected_seq
        expected_seq += 1
        if "payload_hex" in reply:
            assert hashlib.sha256(envelope.payload).hexdigest() == reply["payload_sha256"]
            assert decoder.decode(envelope.payload).events
    with_topic = [b"", b"kv", *frames[1:]]
    assert open_envelope(with_topic).seq == open_envelope(frames).seq


def _as_array(raw: dict[str, Any]) -> list[Any]:
    """The positional (pre map-encoding) form of a captured event."""
    if raw["type"] == "BlockStored":
        return ["BlockStored", raw["block_hashes"], raw["parent_block_hash"], raw["token_ids"], raw["block_size"],
                raw["lora_id"], raw["medium"], raw["lora_name"], raw.get("extra_keys")]
    if raw["type"] == "BlockRemoved":
        return ["BlockRemoved", raw["block_hashes"], raw["medium"]]
    return ["AllBlocksCleared"]


@pytest.mark.parametrize("server", SERVERS)
def test_array_encoding_decodes_the_same(server: str) -> None:
    decoder = BatchDecoder()
    for item in captured(server)[:12]:
        ts, raw_events, rank = item.decoded
        as_arrays = msgspec.msgpack.encode([ts, [_as_array(raw) for raw in raw_events], rank])
        assert decoder.decode(as_arrays).events == decoder.decode(_payload(server, item)).events


def test_unknown_event_types_are_skipped_not_fatal() -> None:
    payload = msgspec.msgpack.encode([1.5, [{"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None,
                                             "token_ids": [], "block_size": 256, "lora_id": None, "medium": "cpu",
                                             "lora_name": None},
                                            {"type": "SomethingNewer", "x": 1}], 0])
    batch = BatchDecoder().decode(payload)
    assert batch.skipped == 1
    assert batch.events == [BlockStored([7], None, "cpu", None)]
    assert normalize_medium("cpu") == "CPU"
