"""Watch a real vLLM's KV-cache events the way a ledger would: a ZMQ SUB socket on its PUB endpoint.

vLLM publishes multipart messages ``[topic, seq (8 bytes, big-endian), payload]``; the payload is msgpack of
``[ts, events, data_parallel_rank]`` and each event is a map tagged by ``"type"`` (vLLM 0.32's encoding).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq


@dataclass(frozen=True)
class KvEvent:
    seq: int
    ts: float
    kind: str
    fields: dict[str, Any]

    @property
    def block_hashes(self) -> list[int]:
        hashes: list[int] = self.fields.get("block_hashes", [])
        return hashes

    @property
    def extra_keys(self) -> list[list[Any] | None]:
        keys: list[list[Any] | None] = self.fields.get("extra_keys") or []
        return keys

    def salts(self) -> list[str | None]:
        """The ``cache_salt`` named by each stored block (its only extra key for a text-only, no-LoRA model);
        vLLM names it on the root block of a chain only."""
        return [keys[-1] if keys else None for keys in self.extra_keys]


def decode_batch(seq_bytes: bytes, payload: bytes) -> list[KvEvent]:
    seq = int.from_bytes(seq_bytes, "big", signed=True)
    ts, raw_events, *_rank = msgspec.msgpack.decode(payload)
    events: list[KvEvent] = []
    for raw in raw_events:
        assert isinstance(raw, dict), f"expected map-encoded events from vLLM 0.32, got {type(raw).__name__}"
        fields = {name: value for name, value in raw.items() if name != "type"}
        events.append(KvEvent(seq=seq, ts=float(ts), kind=str(raw["type"]), fields=fields))
    return events


@dataclass
class KvEventWatcher:
    """Collects every event that arrives on a SUB socket connected to vLLM's PUB endpoint."""

    endpoint: str
    context: zmq.Context[zmq.Socket[bytes]] = field(default_factory=zmq.Context)
    events: list[KvEvent] = field(default_factory=list)
    socket: zmq.Socket[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.connect(self.endpoint)

    def receive(self, wait_s: float) -> int:
        """Take in what arrives within `wait_s` (and whatever is queued); returns how many batches."""
        batches = 0
        deadline = time.monotonic() + wait_s
        while True:
            remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
            if not self.socket.poll(remaining_ms if batches == 0 else 0):
                return batches
            _topic, seq_bytes, payload = self.socket.recv_multipart()
            self.events.extend(decode_batch(seq_bytes, payload))
            batches += 1

    def drain(self, quiet_s: float = 0.2) -> int:
        """Take in everything already published (until the socket stays quiet for `quiet_s`); returns the
        number of events collected so far, to pass as `since` to `wait_for` after the next request. Events of
        earlier requests then sit before that mark and can never satisfy a later check."""
        while self.receive(quiet_s):
            pass
        return len(self.events)

    def wait_for(self, predicate: Callable[[KvEvent], bool], since: int, timeout_s: float = 60.0) -> KvEvent:
        """The first event collected at or after index `since` matching `predicate`, waiting for more events
        until the deadline (a bound on waiting, not a timing assertion)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events[since:]:
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                kinds = [event.kind for event in self.events[since:][-20:]]
                raise AssertionError(f"no matching KV event within {timeout_s} s; last kinds seen: {kinds}")
            self.receive(min(remaining, 0.5))

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()
