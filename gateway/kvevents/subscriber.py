"""One vLLM KV-event source: a SUB socket on its PUB endpoint and a DEALER on its replay ROUTER.

Batches go to the sink strictly in sequence order. Continuity with the last batch handled is proved, never
assumed: on start, after every gap, for a lower sequence number the tracker cannot place, and on each idle
probe, the subscriber asks replay from the cursor's own sequence number and checks that the first batch is
the very one it handled (same timestamp). If it differs, or is gone while later batches exist, or replay has
nothing at or after the cursor, the publisher restarted: the sink closes the old process's blocks and the new
process is replayed from its start; what replay cannot supply is reported missing. When the replay endpoint,
having answered before, stops answering for `lost_after_s`, the source is reported silent (its blocks are
unknown, not closed); proven continuity afterwards resumes it.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

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

if TYPE_CHECKING:  # pyzmq is imported by whoever opens the context: a gateway with no KV-event source never does
    import zmq.asyncio

log = get_logger(__name__)
RECEIVE_QUEUE = 100_000  # live messages held by ZMQ while a replay is being read


class BatchSink(Protocol):
    async def deliver(self, source: str, seq: int, batch: EventBatch, received_at: float | None) -> None: ...

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None: ...

    async def restarted(self, source: str, boundary_ts: float, previous: Cursor, proven: bool) -> None:
        """`proven`: the cursor's batch was seen replaced; False when it is merely gone from replay while later
        batches exist (the buffer may have moved past it), so the restart is presumed."""
        ...

    async def silent(self, source: str, since: float) -> None: ...

    async def resumed(self, source: str) -> None: ...


@dataclass(frozen=True)
class SubscriberTiming:
    replay_timeout_s: float = 2.0
    probe_interval_s: float = 5.0
    lost_after_s: float = 30.0


class Subscriber:
    def __init__(
        self, spec: SourceSpec, sink: BatchSink, cursor: Cursor | None, timing: SubscriberTiming,
        context: zmq.asyncio.Context, silent: bool = False,
    ) -> None:
        self.spec = spec
        self.sink = sink
        self.timing = timing
        self.tracker = SequenceTracker(cursor)
        self._context = context
        self._decoder = decoder_for(spec.format)
        self._dealer: zmq.asyncio.Socket | None = None
        self._replay_answered = False
        self._replay_complete = False  # the last replay ended with its end marker
        self._last_sign_of_life = time.monotonic()
        self._silent = silent  # the source was silent when this subscriber started

    async def run(self) -> None:
        import zmq  # loaded with the context this subscriber was given

        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.spec.endpoint)
        log.info("kv_events_subscribed", source=self.spec.name, endpoint=self.spec.endpoint,
                 replay=self.spec.replay, resume_from=self.tracker.expected)
        try:
            await self._check_continuity()
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
        received_at = time.time()
        await self._alive()
        try:
            envelope = open_envelope(frames)
            batch = self._decoder.decode(envelope.payload)
        except WireError as error:
            # Not accepted: the next batch shows a gap, and replay or the gap count accounts for it.
            log.warning("kv_event_undecodable", source=self.spec.name, error=str(error))
            return
        await self._handle(envelope, batch, may_replay=True, received_at=received_at)

    async def _handle(
        self, envelope: Envelope, batch: EventBatch, may_replay: bool, received_at: float | None = None,
    ) -> None:
        arrival = self.tracker.classify(envelope.seq, batch.ts, envelope.publisher)
        if arrival.verdict is Verdict.DUPLICATE:
            return
        if arrival.verdict is Verdict.RESTART:
            await self._restart(batch.ts, "an earlier sequence number came with another batch")
            if may_replay:
                await self._catch_up(0)
            await self._handle(envelope, batch, may_replay=False)
            return
        if arrival.verdict in (Verdict.GAP, Verdict.UNCERTAIN) and may_replay:
            await self._check_continuity()
            await self._handle(envelope, batch, may_replay=False, received_at=received_at)
            return
        if arrival.verdict is Verdict.UNCERTAIN:
            # Replay could not say whether this is an old batch or a new process: not applied, and said so.
            log.warning("kv_events_unplaced_batch", source=self.spec.name, seq=envelope.seq)
            return
        if arrival.verdict is Verdict.GAP:
            await self._report_missing(arrival.missing_first, arrival.missing_last)
        await self.sink.deliver(self.spec.name, envelope.seq, batch, received_at)
        self.tracker.accept(envelope.seq, batch.ts, envelope.publisher)
        self._silent = False  # the sink resumes a silent source on its next batch

    async def _restart(self, boundary_ts: float, why: str, proven: bool = True) -> None:
        previous = self.tracker.cursor
        log.warning("kv_events_publisher_restarted", source=self.spec.name, why=why, proven=proven,
                    previous_seq=previous.seq if previous else None)
        if previous is not None:
            await self.sink.restarted(self.spec.name, boundary_ts, previous, proven)
        self.tracker.forget()
        self._silent = False

    async def _report_missing(self, first: int, last: int) -> None:
        after_ts = self.tracker.cursor.ts if self.tracker.cursor else 0.0
        log.warning("kv_events_missing", source=self.spec.name, first_seq=first, last_seq=last)
        await self.sink.missing(self.spec.name, first, last, after_ts)

    # -- replay ----------------------------------------------------------------------------------

    async def _check_continuity(self) -> bool:
        """Replay from the cursor's own batch: the same batch proves continuity (and the rest is handled as
        it comes); another batch, or none at or after the cursor, proves a restart. False if replay is silent."""
        cursor = self.tracker.cursor
        if cursor is None:
            return await self._catch_up(0)
        if self.spec.replay is None:
            return False
        judged: Continuity | None = None
        restart_ts = cursor.ts
        async with aclosing(self._replies(cursor.seq)) as replies:
            async for envelope, batch in replies:
                if judged is None:
                    judged = _judge_first(cursor, envelope, batch)
                    if judged is not Continuity.PROVEN:
                        restart_ts = batch.ts if batch is not None else cursor.ts
                        break
                    await self._proven()
                    if envelope.seq == cursor.seq:
                        continue
                if batch is not None:
                    await self._handle(envelope, batch, may_replay=False)
        if judged is None and self._replay_complete:
            judged = Continuity.RESTART  # nothing at or after the cursor: a new process that is not that far yet
        if judged in (Continuity.RESTART, Continuity.PRESUMED):
            why = ("replay no longer holds the cursor's batch, later ones exist" if judged is Continuity.PRESUMED
                   else "replay holds another batch at the cursor, or nothing at or after it")
            await self._restart(restart_ts, why, proven=judged is Continuity.RESTART)
            await self._catch_up(0)
            return True
        return judged is not None or self._replay_complete

    async def _proven(self) -> None:
        if self._silent:
            self._silent = False
            await self.sink.resumed(self.spec.name)

    async def _catch_up(self, start: int) -> bool:
        """Replay every buffered batch from `start`; False if the replay endpoint did not answer."""
        if self.spec.replay is None:
            return False
        async with aclosing(self._replies(start)) as replies:
            async for envelope, batch in replies:
                if batch is not None:
                    await self._handle(envelope, batch, may_replay=False)
        return self._replay_complete

    async def _replies(self, start: int) -> AsyncGenerator[tuple[Envelope, EventBatch | None], None]:
        """Replay replies from `start` (None for an undecodable payload) until the end marker; a replay left
        unfinished (silent, or abandoned by the caller) closes the DEALER, so its late answers are dropped."""
        self._replay_complete = False
        dealer = self._dealer_socket()
        try:
            await dealer.send_multipart(replay_request(start))
            wait_ms = int(self.timing.replay_timeout_s * 1000)
            while await dealer.poll(timeout=wait_ms):
                self._replay_answered = True
                await self._alive()
                frames = await dealer.recv_multipart()
                try:
                    envelope = open_envelope(frames)
                except WireError as error:
                    log.warning("kv_event_undecodable", source=self.spec.name, error=str(error), replay=True)
                    continue
                if envelope.seq == END_OF_REPLAY:
                    self._replay_complete = True
                    return
                yield envelope, self._decode_replayed(envelope)
            log.info("kv_events_replay_silent", source=self.spec.name, start_seq=start)
        finally:
            if not self._replay_complete:
                self._close_dealer()

    def _decode_replayed(self, envelope: Envelope) -> EventBatch | None:
        try:
            return self._decoder.decode(envelope.payload)
        except WireError as error:
            log.warning("kv_event_undecodable", source=self.spec.name, error=str(error), replay=True)
            return None

    async def _probe(self) -> None:
        """Idle: prove continuity through replay; it also tells whether the publisher is still there.

        The probe runs even before replay has ever answered (the gateway may start before vLLM), but a
        source is only declared silent once its replay endpoint has answered at least once.
        """
        if await self._check_continuity() or not self._replay_answered:
            return
        silent_for = time.monotonic() - self._last_sign_of_life
        if not self._silent and silent_for >= self.timing.lost_after_s:
            self._silent = True
            log.warning("kv_events_source_silent", source=self.spec.name, silent_s=round(silent_for, 1))
            await self.sink.silent(self.spec.name, time.time() - silent_for)

    async def _alive(self) -> None:
        self._last_sign_of_life = time.monotonic()

    def _dealer_socket(self) -> zmq.asyncio.Socket:
        if self._dealer is None:
            assert self.spec.replay is not None
            import zmq

            self._dealer = self._context.socket(zmq.DEALER)
            self._dealer.setsockopt(zmq.LINGER, 0)
            self._dealer.connect(self.spec.replay)
        return self._dealer

    def _close_dealer(self) -> None:
        if self._dealer is not None:
            self._dealer.close(linger=0)
            self._dealer = None


class Continuity(StrEnum):
    """What replay says about the batch a resumed subscriber's cursor names."""

    PROVEN = "proven"  # the cursor's own batch: the same publisher process
    RESTART = "restart"  # another batch at that number, or nothing at or after it: a new process
    PRESUMED = "presumed"  # only later numbers: a restart, or a replay buffer that moved past the cursor


def _judge_first(cursor: Cursor, envelope: Envelope, batch: EventBatch | None) -> Continuity:
    """Replay's first batch at or after the cursor: the cursor's own batch (`proven` continuity), another
    batch at that number (`restart`), or a later number only (`presumed` restart: the cursor's batch is gone,
    which a restart explains, but so does a replay buffer that moved past it)."""
    if envelope.seq != cursor.seq:
        return Continuity.PRESUMED
    if batch is not None and batch.ts == cursor.ts:
        return Continuity.PROVEN
    return Continuity.RESTART
