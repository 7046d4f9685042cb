"""One vLLM KV-event source: a SUB socket on its PUB endpoint and a DEALER on its replay ROUTER.

Batches go to the sink strictly in sequence order. On start, and whenever the sequence jumps, the
subscriber asks the replay endpoint for what it has not seen; what replay cannot supply is reported as
missing. A lower sequence number with a later timestamp means the publisher restarted. When the replay
endpoint, having answered before, stops answering for `lost_after_s`, the source is reported lost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio

from gateway.kvevents.endpoints import SourceSpec
from gateway.kvevents.formats.base import decoder_for
from gateway.kvevents.sequence import Cursor, SequenceTracker, Verdict
from gateway.kvevents.wire import (
    END_OF_REPLAY,
    Envelope,
    EventBatch,
    WireError,
    open_envelope,
    replay_request,
)
from gateway.log import get_logger

log = get_logger(__name__)
RECEIVE_QUEUE = 100_000  # live messages held by ZMQ while a replay is being read


class BatchSink(Protocol):
    async def deliver(self, source: str, seq: int, batch: EventBatch) -> None: ...

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None: ...

    async def restarted(self, source: str, boundary_ts: float) -> None: ...

    async def lost(self, source: str, boundary_ts: float) -> None: ...


@dataclass(frozen=True)
class SubscriberTiming:
    replay_timeout_s: float = 2.0
    probe_interval_s: float = 5.0
    lost_after_s: float = 30.0


class Subscriber:
    def __init__(
        self, spec: SourceSpec, sink: BatchSink, cursor: Cursor | None, timing: SubscriberTiming,
        context: zmq.asyncio.Context,
    ) -> None:
        self.spec = spec
        self.sink = sink
        self.timing = timing
        self.tracker = SequenceTracker(cursor)
        self._context = context
        self._decoder = decoder_for(spec.format)
        self._dealer: zmq.asyncio.Socket | None = None
        self._replay_answered = False
        self._last_sign_of_life = time.monotonic()
        self._lost = False

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.spec.endpoint)
        log.info("kv_events_subscribed", source=self.spec.name, endpoint=self.spec.endpoint,
                 replay=self.spec.replay, resume_from=self.tracker.expected)
        try:
            await self._catch_up(self.tracker.expected)
            await self._listen(sub)
        finally:
            sub.close(linger=0)
            self._close_dealer()

    async def _listen(self, sub: zmq.asyncio.Socket) -> None:
        idle_ms = int(self.timing.probe_interval_s * 1000)
        while True:
            if await sub.poll(timeout=idle_ms):
                await self._on_live(await sub.recv_multipart())
            else:
                await self._probe()

    async def _on_live(self, frames: list[bytes]) -> None:
        self._alive()
        try:
            envelope = open_envelope(frames)
            batch = self._decoder.decode(envelope.payload)
        except WireError as error:
            # Not accepted: the next batch shows a gap, and replay or the gap count accounts for it.
            log.warning("kv_event_undecodable", source=self.spec.name, error=str(error))
            return
        await self._handle(envelope, batch, may_replay=True)

    async def _handle(self, envelope: Envelope, batch: EventBatch, may_replay: bool) -> None:
        arrival = self.tracker.classify(envelope.seq, batch.ts, envelope.publisher)
        if arrival.verdict is Verdict.DUPLICATE:
            return
        if arrival.verdict is Verdict.RESTART:
            await self._restarted(envelope, batch, may_replay)
            return
        if arrival.verdict is Verdict.GAP:
            if may_replay and await self._catch_up(arrival.missing_first):
                await self._handle(envelope, batch, may_replay=False)
                return
            await self._report_missing(arrival.missing_first, arrival.missing_last)
        await self.sink.deliver(self.spec.name, envelope.seq, batch)
        self.tracker.accept(envelope.seq, batch.ts, envelope.publisher)

    async def _restarted(self, envelope: Envelope, batch: EventBatch, may_replay: bool) -> None:
        log.warning("kv_events_publisher_restarted", source=self.spec.name, seq=envelope.seq,
                    previous_seq=self.tracker.cursor.seq if self.tracker.cursor else None)
        await self.sink.restarted(self.spec.name, batch.ts)
        self.tracker.forget()
        if may_replay and envelope.seq > 0:
            await self._catch_up(0)
        await self._handle(envelope, batch, may_replay=False)

    async def _report_missing(self, first: int, last: int) -> None:
        after_ts = self.tracker.cursor.ts if self.tracker.cursor else 0.0
        log.warning("kv_events_missing", source=self.spec.name, first_seq=first, last_seq=last)
        await self.sink.missing(self.spec.name, first, last, after_ts)

    # -- replay ----------------------------------------------------------------------------------

    async def _catch_up(self, start: int) -> bool:
        """Replay every buffered batch from `start`; False if the replay endpoint did not answer."""
        if self.spec.replay is None:
            return False
        dealer = self._dealer_socket()
        await dealer.send_multipart(replay_request(start))
        wait_ms = int(self.timing.replay_timeout_s * 1000)
        while await dealer.poll(timeout=wait_ms):
            self._replay_answered = True
            self._alive()
            if not await self._on_replayed(await dealer.recv_multipart()):
                return True
        log.info("kv_events_replay_silent", source=self.spec.name, start_seq=start)
        self._close_dealer()  # drops a late answer, so it cannot be mistaken for the next one
        return False

    async def _on_replayed(self, frames: list[bytes]) -> bool:
        """Handle one replay reply; False at the end marker."""
        try:
            envelope = open_envelope(frames)
            if envelope.seq == END_OF_REPLAY:
                return False
            batch = self._decoder.decode(envelope.payload)
        except WireError as error:
            log.warning("kv_event_undecodable", source=self.spec.name, error=str(error), replay=True)
            return True
        await self._handle(envelope, batch, may_replay=False)
        return True

    async def _probe(self) -> None:
        """Idle: ask replay for anything missed; it also tells whether the publisher is still there.

        The probe runs even before replay has ever answered (the gateway may start before vLLM), but a
        source is only declared lost once its replay endpoint has answered at least once.
        """
        if await self._catch_up(self.tracker.expected) or not self._replay_answered:
            return
        silent_for = time.monotonic() - self._last_sign_of_life
        if not self._lost and silent_for >= self.timing.lost_after_s:
            self._lost = True
            log.warning("kv_events_source_lost", source=self.spec.name, silent_s=round(silent_for, 1))
            await self.sink.lost(self.spec.name, self.tracker.cursor.ts if self.tracker.cursor else 0.0)

    def _alive(self) -> None:
        self._last_sign_of_life = time.monotonic()
        self._lost = False

    def _dealer_socket(self) -> zmq.asyncio.Socket:
        if self._dealer is None:
            assert self.spec.replay is not None
            self._dealer = self._context.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self.spec.replay)
        return self._dealer

    def _close_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None
