"""A stand-in for vLLM's KV-event publisher that emits vLLM-exact frames, for scripted scenarios.

PUB: `[topic, seq (8 bytes big-endian), msgpack [ts, events, 0]]`, events as maps tagged by "type" with
vLLM's field set. Replay ROUTER on the next port: answers `[b"", start_seq]` with `[b"", seq, payload]` per
buffered batch (vLLM 0.25.0; `replay_topic_frame=True` adds the topic frame as 0.33.0 does), then
`[b"", 0xff*8, b""]`. The ROUTER is served by a thread; `stop()` ends it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgspec
import zmq

END = (-1).to_bytes(8, "big", signed=True)
POLL_MS = 20


def stored(hashes: list[int], parent: int | None = None, medium: str = "GPU", salt: str | None = None,
           block_size: int = 16) -> dict[str, Any]:
    root_keys = [salt] if salt is not None and parent is None else None
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": list(range(block_size * len(hashes))), "block_size": block_size, "lora_id": None,
            "medium": medium, "lora_name": None, "extra_keys": [root_keys] + [None] * (len(hashes) - 1),
            "group_idx": 0, "kv_cache_spec_kind": "full_attention"}


def placeholder(block_hash: int, medium: str = "CPU") -> dict[str, Any]:
    """OffloadingConnector's default CPU event: the chunk's last GPU block hash, no tokens, block_size 0."""
    return {"type": "BlockStored", "block_hashes": [block_hash], "parent_block_hash": None, "token_ids": [],
            "block_size": 0, "lora_id": None, "medium": medium, "lora_name": None, "group_idx": 0}


def removed(hashes: list[int], medium: str = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium, "group_idx": 0}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_batch(ts: float, events: list[dict[str, Any]]) -> bytes:
    return msgspec.msgpack.encode([ts, events, 0])


class VllmPublisher:
    def __init__(self, topic: bytes = b"kv", replay_topic_frame: bool = False) -> None:
        self.topic = topic
        self.replay_topic_frame = replay_topic_frame
        self.answer_replay = True
        self.replays_answered = 0
        self.next_seq = 0
        self._context = zmq.Context()
        self._pub, self._router, self.port = self._bind_pair()
        self._buffer: dict[int, bytes] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, name="vllm-replay", daemon=True)
        self._thread.start()

    def _bind_pair(self) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes], int]:
        """PUB on a free port and the ROUTER on the port after it, as vLLM's replay = port + 1 convention."""
        for _attempt in range(50):
            pub = self._context.socket(zmq.PUB)
            port = pub.bind_to_random_port("tcp://127.0.0.1")
            router = self._context.socket(zmq.ROUTER)
            try:
                router.bind(f"tcp://127.0.0.1:{port + 1}")
            except zmq.ZMQError:
                pub.close(linger=0)
                router.close(linger=0)
                continue
            return pub, router, port
        raise RuntimeError("no free port pair")

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def publish(self, events: list[dict[str, Any]], ts: float | None = None, live: bool = True) -> int:
        """Publish one batch; `live=False` keeps it only in the replay buffer (a message the SUB missed)."""
        return self.publish_payload(encode_batch(time.time() if ts is None else ts, events), live=live)

    def publish_payload(self, payload: bytes, seq: int | None = None, live: bool = True) -> int:
        seq = self.next_seq if seq is None else seq
        self.next_seq = seq + 1
        with self._lock:
            self._buffer[seq] = payload
        if live:
            self._pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def forget(self, seqs: list[int]) -> None:
        """Drop batches from the replay buffer (as if they had aged out of vLLM's buffer_steps)."""
        with self._lock:
            for seq in seqs:
                self._buffer.pop(seq, None)

    def restart(self) -> None:
        """A new vLLM process on the same endpoints: sequence from 0, empty replay buffer."""
        with self._lock:
            self._buffer.clear()
        self.next_seq = 0

    def _serve_replay(self) -> None:
        while not self._stop.is_set():
            if not self._router.poll(POLL_MS):
                continue
            identity, _empty, start = self._router.recv_multipart()
            if self.answer_replay:
                self._answer(identity, int.from_bytes(start, "big"))
                self.replays_answered += 1

    def _answer(self, identity: bytes, start: int) -> None:
        topic = [self.topic] if self.replay_topic_frame else []
        with self._lock:
            batches = sorted((seq, payload) for seq, payload in self._buffer.items() if seq >= start)
        for seq, payload in batches:
            self._router.send_multipart([identity, b"", *topic, seq.to_bytes(8, "big"), payload])
        self._router.send_multipart([identity, b"", *([b""] if topic else []), END, b""])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._pub.close(linger=0)
        self._router.close(linger=0)
        self._context.term()
