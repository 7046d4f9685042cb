"""One source's subscriber against a vLLM-exact publisher on real loopback ZMQ sockets (tests/ledger/publisher.py),
with a sink that records what the subscriber tells it: catch-up from replay, gaps filled by replay or reported
missing, undecodable payloads that become a reported gap (never a silent miss), and publisher restarts proven by
replay. The subscriber runs as an owned task and every wait polls the sink with a deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
import zmq.asyncio

from gateway.kvevents.endpoints import SourceSpec
from gateway.kvevents.sequence import Cursor
from gateway.kvevents.subscriber import Subscriber, SubscriberTiming
from gateway.kvevents.wire import BlockStored, EventBatch
from gateway.tasks import TaskSupervisor
from tests.ledger.publisher import VllmPublisher, stored

WAIT_S = 20.0  # bounds each wait; every wait ends on an observed event
TIMING = SubscriberTiming(replay_timeout_s=1.0, probe_interval_s=0.2, lost_after_s=3600.0)


@dataclass
class RecordingSink:
    """Everything the subscriber reports, in order (what the ledger would act on)."""

    log: list[tuple[object, ...]] = field(default_factory=list)

    async def deliver(self, source: str, seq: int, batch: EventBatch, received_at: float | None) -> None:
        first = batch.events[0] if batch.events else None
        self.log.append(("deliver", seq, first.block_hashes[0] if isinstance(first, BlockStored) else None))

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None:
        self.log.append(("missing", first, last))

    async def restarted(self, source: str, boundary_ts: float, previous: Cursor, proven: bool) -> None:
        self.log.append(("restarted", previous.seq, proven))

    async def silent(self, source: str, since: float) -> None:
        self.log.append(("silent",))

    async def resumed(self, source: str) -> None:
        self.log.append(("resumed",))

    def delivered(self) -> list[tuple[int, object]]:
        return [(int(str(entry[1])), entry[2]) for entry in self.log if entry[0] == "deliver"]


@pytest.fixture
def publisher() -> Iterator[VllmPublisher]:
    pub = VllmPublisher()
    yield pub
    pub.stop()


async def until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not observed within {WAIT_S} s: {what}")
        await asyncio.sleep(0.01)  # polling interval, not synchronisation


@asynccontextmanager
async def subscribed(publisher: VllmPublisher, sink: RecordingSink,
                     cursor: Cursor | None = None) -> AsyncIterator[Subscriber]:
    spec = SourceSpec("pool/0", publisher.endpoint, f"tcp://127.0.0.1:{publisher.port + 1}")
    context = zmq.asyncio.Context()
    tasks = TaskSupervisor("test-subscriber")
    subscriber = Subscriber(spec, sink, cursor, TIMING, context)
    tasks.spawn(subscriber.run(), "subscriber")
    try:
        yield subscriber
    finally:
        await tasks.close()
        context.term()


def block(n: int) -> list[dict[str, object]]:
    return [stored([n])]


def test_batches_published_before_subscribing_are_caught_up_from_replay(publisher: VllmPublisher) -> None:
    for n in range(3):
        publisher.publish(block(100 + n), ts=1000.0 + n, live=False)

    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink):
            await until(lambda: len(sink.delivered()) == 3, "the three buffered batches")
            await until(lambda: publisher.replays_answered > 0, "a replay")
            publisher.publish(block(103), ts=1003.0)
            await until(lambda: len(sink.delivered()) == 4, "the live batch")
        assert sink.delivered() == [(0, 100), (1, 101), (2, 102), (3, 103)]
        assert [entry for entry in sink.log if entry[0] != "deliver"] == []

    asyncio.run(run())


def test_a_batch_the_subscriber_missed_is_filled_from_replay_or_reported_missing(publisher: VllmPublisher) -> None:
    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink) as subscriber:
            await until(lambda: publisher.replays_answered > 0, "the first replay")
            publisher.publish(block(100), ts=1000.0)
            await until(lambda: subscriber.tracker.expected == 1, "batch 0")
            publisher.publish(block(101), ts=1001.0, live=False)  # missed live, still in replay
            publisher.publish(block(102), ts=1002.0, live=False)
            publisher.forget([2])  # and this one aged out of the replay buffer
            publisher.publish(block(103), ts=1003.0)
            await until(lambda: subscriber.tracker.expected == 4, "batch 3")
        assert sink.delivered() == [(0, 100), (1, 101), (3, 103)]
        assert ("missing", 2, 2) in sink.log
        assert sink.log.index(("missing", 2, 2)) < sink.log.index(("deliver", 3, 103))

    asyncio.run(run())


def test_an_undecodable_payload_becomes_a_reported_gap(publisher: VllmPublisher) -> None:
    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink) as subscriber:
            await until(lambda: publisher.replays_answered > 0, "the first replay")
            publisher.publish(block(100), ts=1000.0)
            await until(lambda: subscriber.tracker.expected == 1, "batch 0")
            publisher.publish_payload(b"\xc1 not msgpack")  # seq 1, live and in replay, unreadable both ways
            publisher.publish(block(102), ts=1002.0)
            await until(lambda: subscriber.tracker.expected == 3, "batch 2")
        assert sink.delivered() == [(0, 100), (2, 102)]
        assert ("missing", 1, 1) in sink.log

    asyncio.run(run())


def test_a_restarted_publisher_is_proven_by_replay_and_its_batches_are_delivered(publisher: VllmPublisher) -> None:
    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink) as subscriber:
            await until(lambda: publisher.replays_answered > 0, "the first replay")
            publisher.publish(block(100), ts=1000.0)
            publisher.publish(block(101), ts=1001.0)
            await until(lambda: subscriber.tracker.expected == 2, "the old process's batches")
            publisher.restart()  # a new vLLM process: seq from 0, another batch at seq 0
            publisher.publish(block(200), ts=1500.0)
            await until(lambda: ("restarted", 1, True) in sink.log, "the restart")
            await until(lambda: (0, 200) in sink.delivered(), "the new process's first batch")
        assert sink.delivered() == [(0, 100), (1, 101), (0, 200)]

    asyncio.run(run())


def test_a_stored_cursor_the_publisher_still_holds_is_continued(publisher: VllmPublisher) -> None:
    for n in range(3):
        publisher.publish(block(100 + n), ts=1000.0 + n, live=False)

    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink, cursor=Cursor(1, 1001.0)):  # handled before a gateway restart
            await until(lambda: len(sink.delivered()) == 1, "the batch after the cursor")
        assert sink.delivered() == [(2, 102)]
        assert not any(entry[0] == "restarted" for entry in sink.log)

    asyncio.run(run())


def test_a_stored_cursor_whose_batch_was_replaced_is_a_proven_restart(publisher: VllmPublisher) -> None:
    for n in range(3):
        publisher.publish(block(200 + n), ts=2000.0 + n, live=False)  # a new process, already past seq 1

    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink, cursor=Cursor(1, 1001.0)):
            await until(lambda: len(sink.delivered()) == 3, "the new process from its start")
        assert sink.log[0] == ("restarted", 1, True)
        assert sink.delivered() == [(0, 200), (1, 201), (2, 202)]

    asyncio.run(run())


def test_a_replay_with_nothing_at_or_after_the_cursor_is_a_new_process_not_yet_that_far(
        publisher: VllmPublisher) -> None:
    for n in range(2):
        publisher.publish(block(300 + n), ts=3000.0 + n, live=False)

    async def run() -> None:
        sink = RecordingSink()
        async with subscribed(publisher, sink, cursor=Cursor(5, 1005.0)):
            await until(lambda: len(sink.delivered()) == 2, "the new process's two batches")
        assert sink.log == [("restarted", 5, True), ("deliver", 0, 300), ("deliver", 1, 301)]

    asyncio.run(run())
