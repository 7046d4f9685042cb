"""The KV-event publisher over real ZMQ sockets (ipc:// in a private folder): the live PUB frames, the replay
ROUTER with and without a topic frame, the replay buffer's bound, the bounded queue, and vLLM's bind rule."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest
import zmq
import zmq.asyncio

from gateway.sim import kv_events
from gateway.sim.config import SimConfig
from gateway.sim.publisher import END_SEQ, MAX_QUEUE, KvEventPublisher, binds
from tests.unit.sim.asgi_exchange import until

T = TypeVar("T")


@pytest.mark.parametrize(
    ("endpoint", "bind"),
    [
        ("tcp://*:5557", True),
        ("tcp://[::]:5557", True),
        ("ipc:///tmp/kv.sock", True),
        ("inproc://kv", True),
        ("tcp://127.0.0.1:5557", False),
        ("tcp://gateway.internal:5557", False),
        ("tcp://[::1]:5557", True),  # "::" appears in it: vLLM's rule is a plain substring test
    ],
)
def test_vllm_bind_rule(endpoint: str, bind: bool) -> None:
    assert binds(endpoint) is bind


def test_describe_is_vllms_kv_events_config() -> None:
    config = SimConfig(kv_events_endpoint="tcp://*:5557", kv_events_replay_endpoint="tcp://*:5558",
                       kv_events_topic="kv", kv_events_buffer_steps=7, kv_events_hwm=9)
    assert KvEventPublisher(config).describe() == {
        "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558", "buffer_steps": 7, "hwm": 9, "max_queue_size": MAX_QUEUE, "topic": "kv"}


def test_a_full_queue_drops_and_counts_the_batch() -> None:
    publisher = KvEventPublisher(SimConfig(kv_events_endpoint="inproc://unused"))
    event = [kv_events.all_cleared()]
    for _ in range(MAX_QUEUE):
        publisher.publish(event)
    assert (publisher.enqueued, publisher.dropped) == (MAX_QUEUE, 0)
    publisher.publish(event)
    assert (publisher.enqueued, publisher.dropped, publisher.next_seq) == (MAX_QUEUE, 1, 0)
    assert publisher.truth.batches == 0  # nothing was sent: the truth counts only what left the socket


class Sockets:
    """A running publisher and the client side of its sockets."""

    def __init__(self, publisher: KvEventPublisher, context: zmq.asyncio.Context, pub: str, replay: str) -> None:
        self.publisher = publisher
        self.context = context
        self.pub_endpoint = pub
        self.replay_endpoint = replay

    async def drained(self) -> None:
        await until(lambda: self.publisher.next_seq >= self.publisher.enqueued, "the queue to be sent")

    async def replay(self, request: list[bytes]) -> list[list[bytes]]:
        dealer = self.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            await dealer.send_multipart(request)
            replies = []
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), 10.0)
                replies.append(frames)
                if END_SEQ in frames:
                    return replies
        finally:
            dealer.close(linger=0)


@asynccontextmanager
async def running(**overrides: Any) -> AsyncIterator[Sockets]:
    with tempfile.TemporaryDirectory(prefix="kvpub") as folder:
        pub, replay_endpoint = f"ipc://{Path(folder) / 'pub'}", f"ipc://{Path(folder) / 'replay'}"
        config = replace(SimConfig(), kv_events_endpoint=pub, kv_events_replay_endpoint=replay_endpoint,
                         kv_events_topic="kv", **overrides)
        publisher = KvEventPublisher(config)
        publisher.open()
        context = zmq.asyncio.Context()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(publisher.run())
                try:
                    yield Sockets(publisher, context, pub, replay_endpoint)
                finally:
                    publisher.stop()
        finally:
            context.term()


def scenario(body: Callable[[Sockets], Awaitable[T]], **overrides: Any) -> T:
    async def main() -> T:
        async with running(**overrides) as sockets:
            return await body(sockets)

    return asyncio.run(main())


def publish(sockets: Sockets, count: int) -> None:
    for index in range(count):
        sockets.publisher.publish([kv_events.gpu_removed(index)])


def test_live_frames_are_topic_seq_and_a_msgpack_batch() -> None:
    async def body(sockets: Sockets) -> list[list[bytes]]:
        sub = sockets.context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(sockets.pub_endpoint)
        try:
            # A SUB misses what is sent before its subscription arrives: publish until one batch gets through.
            received: list[list[bytes]] = []
            deadline = time.monotonic() + 10
            while not received:
                assert time.monotonic() < deadline, "no batch reached the subscriber"
                sockets.publisher.publish([kv_events.all_cleared()])
                await sockets.drained()
                if await sub.poll(20):
                    received.append(await sub.recv_multipart())
            sockets.publisher.publish([kv_events.gpu_removed(7)])
            received.append(await asyncio.wait_for(sub.recv_multipart(), 10.0))
            return received
        finally:
            sub.close(linger=0)

    warm, frames = scenario(body)
    topic, seq, payload = frames
    assert topic == b"kv" and len(seq) == 8
    assert int.from_bytes(seq, "big") == int.from_bytes(warm[1], "big") + 1
    ts, events, rank = msgspec.msgpack.decode(payload)
    assert isinstance(ts, float) and 1e9 < ts < 1e10 and rank == 0  # wall-clock seconds, not milliseconds
    assert events == [kv_events.gpu_removed(7)]
    assert payload[:2] == b"\x93\xcb"  # a 3-array, then the timestamp as a float64, as vLLM encodes it


def test_replay_answers_every_buffered_batch_from_the_start_then_the_end_marker() -> None:
    async def body(sockets: Sockets) -> tuple[list[list[bytes]], list[list[bytes]]]:
        publish(sockets, 4)
        await sockets.drained()
        return (await sockets.replay([b"", (2).to_bytes(8, "big")]),
                await sockets.replay([b"", (99).to_bytes(8, "big")]))

    from_two, beyond = scenario(body)
    assert [frames[:3] for frames in from_two[:-1]] == [[b"", b"kv", (2).to_bytes(8, "big")],
                                                       [b"", b"kv", (3).to_bytes(8, "big")]]
    assert msgspec.msgpack.decode(from_two[0][3])[1] == [kv_events.gpu_removed(2)]
    assert from_two[-1] == beyond[-1] == [b"", b"", END_SEQ, b""]
    assert len(beyond) == 1


def test_replay_without_the_topic_frame_as_vllm_0_25_0() -> None:
    async def body(sockets: Sockets) -> list[list[bytes]]:
        publish(sockets, 2)
        await sockets.drained()
        return await sockets.replay([b"", (1).to_bytes(8, "big")])

    replies = scenario(body, replay_without_topic=True)
    assert len(replies) == 2
    assert replies[0][:2] == [b"", (1).to_bytes(8, "big")] and len(replies[0]) == 3
    assert replies[1] == [b"", END_SEQ, b""]


def test_the_replay_buffer_keeps_the_last_buffer_steps_batches() -> None:
    async def body(sockets: Sockets) -> list[int]:
        publish(sockets, 6)
        await sockets.drained()
        replies = await sockets.replay([b"", (0).to_bytes(8, "big")])
        return [int.from_bytes(frames[2], "big") for frames in replies[:-1]]

    assert scenario(body, kv_events_buffer_steps=3) == [3, 4, 5]


def test_a_malformed_replay_request_is_ignored_and_the_endpoint_keeps_serving() -> None:
    async def body(sockets: Sockets) -> list[list[bytes]]:
        publish(sockets, 1)
        await sockets.drained()
        dealer = sockets.context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(sockets.replay_endpoint)
        try:
            await dealer.send_multipart([(0).to_bytes(8, "big")])  # no empty delimiter frame: ignored
            await dealer.send_multipart([b"", (0).to_bytes(8, "big")])  # answered, in order, on the same socket
            replies = [await asyncio.wait_for(dealer.recv_multipart(), 10.0) for _ in range(2)]
            assert not await dealer.poll(0)  # and nothing else is waiting
            return replies
        finally:
            dealer.close(linger=0)

    batch, end = scenario(body)
    assert batch[:3] == [b"", b"kv", (0).to_bytes(8, "big")]
    assert end == [b"", b"", END_SEQ, b""]


def test_the_truth_counts_what_was_sent_with_its_owner() -> None:
    async def body(sockets: Sockets) -> dict[str, Any]:
        sockets.publisher.publish([kv_events.gpu_stored([1, 2], None, [0] * 32, 16, "s")], "s")
        sockets.publisher.publish([kv_events.gpu_removed(1)])
        await sockets.drained()
        return sockets.publisher.truth.view()

    assert scenario(body) == {"batches_sent": 2,
                              "by_salt": {"s": {"GPU": {"stored": 2, "removed": 1, "resident": 1}}}}


def test_stop_sends_what_is_queued_before_closing() -> None:
    async def main() -> int:
        async with running() as sockets:
            publish(sockets, 3)  # queued, then the block ends: stop() must still send them
            publisher = sockets.publisher
        return publisher.next_seq

    assert asyncio.run(main()) == 3


def test_an_unusable_endpoint_fails_open() -> None:
    publisher = KvEventPublisher(SimConfig(kv_events_endpoint="bogus://nowhere"))
    with pytest.raises(zmq.ZMQError):
        publisher.open()
    publisher._close()  # release the context open() made (what run() does when it ends)
