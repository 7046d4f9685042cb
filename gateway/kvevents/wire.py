"""vLLM's KV-event wire format, decoded. Pure: bytes in, typed batches out.

A live message is `[topic, seq, payload]`; a replay reply seen by a DEALER is `[b"", (topic,) seq, payload]`.
In both, the sequence number is the frame just before the payload, 8 bytes big-endian (newer publishers may
append a 16-byte publisher id). The payload is msgpack `[ts, events, data_parallel_rank]`; events are maps
tagged by `"type"` (current vLLM) or positional arrays whose first element is the type (older vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.kvevents.media import GPU, BlockMedium

HashValue = int | bytes
SEQ_BYTES = 8
END_OF_REPLAY = -1


class BlockStored(msgspec.Struct, tag=True, frozen=True):
    """Only the fields the ledger reads are declared; msgspec skips the rest without building objects."""

    block_hashes: list[HashValue]
    parent_block_hash: HashValue | None = None
    medium: str | None = None
    extra_keys: list[Any] | None = None


class BlockRemoved(msgspec.Struct, tag=True, frozen=True):
    block_hashes: list[HashValue]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, frozen=True):
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


class _MapBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[KvEvent]
    data_parallel_rank: int | None = None


# Older vLLM encoded events as positional arrays; msgspec cannot mix array and map structs in one union,
# so they get their own types and are converted to the map types above.
class _ArrayStored(msgspec.Struct, tag="BlockStored", array_like=True):
    block_hashes: list[HashValue]
    parent_block_hash: HashValue | None = None
    token_ids: Any = None
    block_size: Any = None
    lora_id: Any = None
    medium: str | None = None
    lora_name: Any = None
    extra_keys: list[Any] | None = None


class _ArrayRemoved(msgspec.Struct, tag="BlockRemoved", array_like=True):
    block_hashes: list[HashValue]
    medium: str | None = None


class _ArrayCleared(msgspec.Struct, tag="AllBlocksCleared", array_like=True):
    pass


_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared


@dataclass(frozen=True)
class EventBatch:
    ts: float
    events: list[KvEvent]
    skipped: int = 0  # events of a type this decoder does not know (newer vLLM); ignored, not fatal


class WireError(ValueError):
    """A message that is not a vLLM KV-event message."""


@dataclass(frozen=True)
class Envelope:
    seq: int
    payload: bytes
    publisher: bytes = b""


class BatchDecoder:
    """Holds the msgspec decoders (building them is the costly part), so create one per subscriber."""

    def __init__(self) -> None:
        self._fast = msgspec.msgpack.Decoder(_MapBatch)
        self._untyped = msgspec.msgpack.Decoder()

    def decode(self, payload: bytes) -> EventBatch:
        try:
            batch = self._fast.decode(payload)
        except msgspec.DecodeError:
            return self._decode_tolerant(payload)
        return EventBatch(ts=batch.ts, events=batch.events)

    def _decode_tolerant(self, payload: bytes) -> EventBatch:
        try:
            raw = self._untyped.decode(payload)
        except msgspec.DecodeError as error:
            raise WireError(f"payload is not msgpack: {error}") from error
        if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
            raise WireError("payload is not a [ts, events, ...] array")
        ts = _as_float(raw[0])
        events = [event for item in raw[1] if (event := convert_event(item)) is not None]
        return EventBatch(ts=ts, events=events, skipped=len(raw[1]) - len(events))


def _as_float(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError("batch timestamp is not a number")
    return float(value)


def convert_event(item: Any) -> KvEvent | None:
    """One undecoded event (a tagged map or a positional array) as a KvEvent; None when it is neither."""
    try:
        if isinstance(item, dict):
            converted: KvEvent = msgspec.convert(item, KvEvent)
            return converted
        if isinstance(item, list):
            return _from_array(msgspec.convert(item, _ArrayEvent))
    except msgspec.ValidationError:
        return None
    return None


def _from_array(event: _ArrayStored | _ArrayRemoved | _ArrayCleared) -> KvEvent:
    if isinstance(event, _ArrayStored):
        return BlockStored(event.block_hashes, event.parent_block_hash, event.medium, event.extra_keys)
    if isinstance(event, _ArrayRemoved):
        return BlockRemoved(event.block_hashes, event.medium)
    return AllBlocksCleared()


def parse_seq(frame: bytes) -> tuple[int, bytes]:
    """(sequence number, publisher id) from a sequence frame; -1 is the end-of-replay marker."""
    if len(frame) < SEQ_BYTES:
        raise WireError(f"sequence frame has {len(frame)} bytes, expected at least {SEQ_BYTES}")
    return int.from_bytes(frame[:SEQ_BYTES], "big", signed=True), bytes(frame[SEQ_BYTES:])


def open_envelope(frames: list[bytes]) -> Envelope:
    """Live PUB message or replay reply, with or without a topic frame: seq is the frame before the payload."""
    if len(frames) < 2:
        raise WireError(f"message has {len(frames)} frames, expected at least 2")
    seq, publisher = parse_seq(frames[-2])
    return Envelope(seq=seq, payload=frames[-1], publisher=publisher)


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends to vLLM's replay ROUTER: an empty delimiter, then the first wanted seq."""
    return [b"", max(start_seq, 0).to_bytes(SEQ_BYTES, "big", signed=True)]


def normalize_medium(medium: str | None) -> BlockMedium:
    """vLLM sends GPU/CPU/STORAGE, LMCache may send `cpu`; events from before `medium` existed were GPU."""
    return GPU if not medium else medium.upper()
