"""KV events over ZMQ exactly as vLLM's ZmqEventPublisher sends them.

- Live: a PUB socket sends `[topic, seq, payload]` per batch: `seq` is 8 bytes big-endian from 0, `payload`
  the msgpack array `[ts, [events...], data_parallel_rank]` (ts a float64 of wall-clock seconds, rank 0).
  The PUB binds when the endpoint contains `*` or `::` or is ipc:// or inproc://; otherwise it connects.
- Replay: a ROUTER socket (always bound) answers a DEALER request `["", seq8]` with one reply per buffered
  batch whose seq >= start, `["", topic, seq8, payload]`, then the end marker `["", "", 0xff*8, ""]`.
  vLLM 0.25.0 sends no topic frame (`["", seq8, payload]`, end `["", 0xff*8, ""]`); `--replay-without-topic`
  imitates it. The last `--kv-events-buffer-steps` batches are kept.
- `publish()` only appends to a bounded in-memory queue (full: the batch is dropped and counted); the
  sending happens in `run()`, a background job the app's lifespan owns and awaits.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

import msgspec
import zmq
import zmq.asyncio

from gateway.sim.config import SimConfig
from gateway.sim.kv_events import Event
from gateway.sim.truth import EmittedTruth

logger = logging.getLogger("gateway.sim")
END_SEQ = b"\xff" * 8
MAX_QUEUE = 100_000


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind for wildcard hosts and local transports, else connect."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class KvEventPublisher:
    """The KV-event PUB socket, its replay ROUTER and the queue between requests and the sockets."""

    def __init__(self, config: SimConfig) -> None:
        self._endpoint = config.kv_events_endpoint or ""
        self._replay_endpoint = config.kv_events_replay_endpoint
        self._topic = config.kv_events_topic.encode()
        self._hwm = config.kv_events_hwm
        self._with_topic = not config.replay_without_topic
        self._queue: deque[tuple[float, list[Event], str | None]] = deque()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.kv_events_buffer_steps)
        self._wake = asyncio.Event()
        self._stopping = False
        self._encode = msgspec.msgpack.Encoder().encode
        self._context: zmq.asyncio.Context | None = None
        self._pub: zmq.asyncio.Socket | None = None
        self._replay: zmq.asyncio.Socket | None = None
        self.next_seq = 0
        self.dropped = 0
        self.truth = EmittedTruth()  # what was sent, for `GET /sim/kv-truth`

    @property
    def enabled(self) -> bool:
        return True

    @property
    def enqueued(self) -> int:
        """Batches handed to the publisher so far (the next one will get this seq)."""
        return self.next_seq + len(self._queue)

    def publish(self, events: list[Event], owner: str | None = None) -> None:
        """Queue one batch (never blocks); it is sent by `run()`."""
        if len(self._queue) >= MAX_QUEUE:
            self.dropped += 1
            return
        self._queue.append((time.time(), events, owner))
        self._wake.set()

    def open(self) -> None:
        """Create, bind or connect the sockets (raises when an endpoint cannot be used)."""
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, self._hwm)
        self._pub.setsockopt(zmq.LINGER, 0)
        (self._pub.bind if binds(self._endpoint) else self._pub.connect)(self._endpoint)
        if self._replay_endpoint:
            self._replay = self._context.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(self._replay_endpoint)

    async def run(self) -> None:
        """Send queued batches (and answer replay requests) until `stop()`; then close the sockets."""
        try:
            async with asyncio.TaskGroup() as group:
                replay = group.create_task(self._serve_replay()) if self._replay is not None else None
                await self._pump()
                if replay is not None:
                    replay.cancel()
        finally:
            self._close()

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def describe(self) -> dict[str, object]:
        """This publisher's settings, in the shape of vLLM's KVEventsConfig (for /kv_event_sources)."""
        return {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": self._endpoint,
                "replay_endpoint": self._replay_endpoint, "buffer_steps": self._buffer.maxlen, "hwm": self._hwm,
                "max_queue_size": MAX_QUEUE, "topic": self._topic.decode()}

    async def _pump(self) -> None:
        while not self._stopping:
            await self._wake.wait()
            self._wake.clear()
            await self._drain()
        await self._drain()

    async def _drain(self) -> None:
        assert self._pub is not None
        while self._queue:
            ts, events, owner = self._queue.popleft()
            seq = self.next_seq
            self.next_seq += 1
            payload = self._encode([ts, events, 0])
            self._buffer.append((seq, payload))
            self.truth.sent(events, owner)
            await self._pub.send_multipart([self._topic, seq.to_bytes(8, "big"), payload])

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) != 3:
                logger.warning("KV replay: ignoring a request of %d frames", len(frames))
                continue
            await self._answer(frames[0], int.from_bytes(frames[2], "big"))

    async def _answer(self, client: bytes, start: int) -> None:
        assert self._replay is not None
        topic = [self._topic] if self._with_topic else []
        for seq, payload in list(self._buffer):
            if seq >= start:
                await self._replay.send_multipart([client, b"", *topic, seq.to_bytes(8, "big"), payload])
        await self._replay.send_multipart([client, b"", *([b""] if self._with_topic else []), END_SEQ, b""])

    def _close(self) -> None:
        for socket in (self._pub, self._replay):
            if socket is not None:
                socket.close(linger=0)
        if self._context is not None:
            self._context.term()
