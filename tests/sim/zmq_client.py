"""A plain ZMQ SUB / DEALER client for the simulator's KV events (msgpack decoded with msgspec)."""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import zmq

from tests.sim.helpers import capture

END_SEQ = b"\xff" * 8


@dataclass(frozen=True)
class Batch:
    topic: bytes
    seq: int
    payload: bytes

    @property
    def decoded(self) -> list[Any]:
        value: list[Any] = msgspec.msgpack.decode(self.payload)
        return value

    @property
    def events(self) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = self.decoded[1]
        return events


class Subscriber:
    """A SUB socket that connects to (or binds for) a simulator's PUB endpoint."""

    def __init__(self, endpoint: str, bind: bool = False) -> None:
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.SUB)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.setsockopt(zmq.SUBSCRIBE, b"")
        (self.socket.bind if bind else self.socket.connect)(endpoint)
        self.received: list[Batch] = []

    def close(self) -> None:
        self.socket.close(linger=0)
        self.context.term()

    def receive(self, timeout_s: float) -> Batch | None:
        if not self.socket.poll(int(timeout_s * 1000)):
            return None
        parts = self.socket.recv_multipart()
        assert len(parts) == 3, parts
        batch = Batch(parts[0], int.from_bytes(parts[1], "big"), parts[2])
        self.received.append(batch)
        return batch

    def receive_through(self, last_seq: int, timeout_s: float = 15.0) -> list[Batch]:
        """Receive until the batch numbered `last_seq`; returns the batches received by this call."""
        deadline = time.monotonic() + timeout_s
        got: list[Batch] = []
        while not got or got[-1].seq < last_seq:
            remaining = deadline - time.monotonic()
            batch = self.receive(remaining) if remaining > 0 else None
            if batch is None:
                raise TimeoutError(f"KV batch {last_seq} not received; got up to {got[-1].seq if got else None}")
            got.append(batch)
        return got

    def warm_up(self, base_url: str, attempts: int = 50) -> None:
        """Send tiny unique requests until the subscription is live, then catch up with what is queued."""
        for _ in range(attempts):
            httpx.post(f"{base_url}/v1/completions", json={"prompt": uuid.uuid4().hex[:16], "max_tokens": 1},
                       timeout=30)
            if self.receive(0.2) is not None:
                self.catch_up(base_url)
                return
        raise TimeoutError("no KV events arrived")

    def catch_up(self, base_url: str) -> list[Batch]:
        """Every batch the server has published so far that this socket has not yet received."""
        total = batches_total(base_url)
        seen = self.received[-1].seq if self.received else -1
        return self.receive_through(total - 1) if total - 1 > seen else []


def batches_total(base_url: str) -> int:
    value: int = httpx.get(f"{base_url}/sim/state", timeout=10).json()["kv_events"]["batches_total"]
    return value


def replay(endpoint: str, start: int, timeout_s: float = 15.0) -> list[list[bytes]]:
    """Ask the ROUTER replay endpoint for batches from `start`; every reply up to and including the end."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", start.to_bytes(8, "big")])
        replies: list[list[bytes]] = []
        while not replies or END_SEQ not in replies[-1]:
            if not dealer.poll(int(timeout_s * 1000)):
                raise TimeoutError("replay did not finish")
            replies.append(dealer.recv_multipart())
        return replies
    finally:
        dealer.close(linger=0)
        context.term()


def captured_events(server: str) -> list[dict[str, Any]]:
    """All decoded events of one captured sample file, in order."""
    lines = capture(f"kv-events/{server}_kv_events.sample.jsonl").read_text().splitlines()
    return [event for line in lines for event in json.loads(line)["decoded"][1]]


def captured_keys(server: str, kind: str, medium: str | None) -> list[str]:
    """The key order of the first captured event of that kind and medium."""
    event = next(e for e in captured_events(server) if e["type"] == kind and e.get("medium") == medium)
    return list(event)
