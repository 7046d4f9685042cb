"""What subscribers hand the ledger, in sequence order per source (the `BatchSink`), and what the writer
reports back once the store has accepted (or dropped) a batch.

Data flows one way: subscriber -> `LedgerState` (pure) -> `BatchWriter` -> store; the metrics follow the
batches the store accepted.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

from gateway.kvevents.sequence import Cursor
from gateway.kvevents.wire import EventBatch
from gateway.ledger.lifecycle import LedgerState, SourceEnd
from gateway.ledger.observe import LedgerMetrics
from gateway.ledger.records import PRESUMED_RESTART, RESTART, BatchOps, GapRecord
from gateway.ledger.writer import BatchWriter
from gateway.log import get_logger
from gateway.policy.reloader import PolicyHolder

log = get_logger(__name__)
CLOCK_SAMPLES = 256  # receive-time samples per source for the clock-offset estimate


class ClockOffsets:
    """Per source, gateway time minus publisher time (an estimate), from the live batches' receive times."""

    def __init__(self) -> None:
        self.offsets: dict[str, float] = {}
        self._samples: dict[str, deque[float]] = {}

    def sample(self, source: str, delay: float) -> None:
        """The smallest recent value is the clock offset plus the least transit delay, the best estimate
        available without the publisher's cooperation."""
        samples = self._samples.setdefault(source, deque(maxlen=CLOCK_SAMPLES))
        samples.append(delay)
        self.offsets[source] = min(samples)

    def snapshot(self) -> dict[str, float]:
        return dict(self.offsets)


class LedgerIngest:
    """The `BatchSink` of every subscriber: each call becomes store operations queued on the writer."""

    def __init__(self, state: LedgerState, writer: BatchWriter, holder: PolicyHolder, metrics: LedgerMetrics,
                 clocks: ClockOffsets) -> None:
        self.state = state
        self.writer = writer
        self.holder = holder
        self.metrics = metrics
        self.clocks = clocks
        # Under `serve --workers N`: reads the salt digests sibling workers issued, before each batch is applied
        # (gateway/http/workers.py), so their requests' blocks are attributed.
        self.before_batch: Callable[[], None] | None = None

    async def deliver(self, source: str, seq: int, batch: EventBatch, received_at: float | None = None) -> None:
        if self.before_batch is not None:
            self.before_batch()
        if received_at is not None:
            self.clocks.sample(source, received_at - batch.ts)
        await self.writer.submit(self.state.apply(source, seq, batch, self.holder.current.version))

    async def missing(self, source: str, first: int, last: int, after_ts: float) -> None:
        self.writer.add_gap(GapRecord(source, first, last, after_ts))
        self.metrics.missing(source, last - first + 1)

    async def restarted(self, source: str, boundary_ts: float, previous: Cursor, proven: bool = True) -> None:
        """Every block stored up to the old process's last batch closes as `restart` (or `restart_presumed`
        when the cursor's batch was only gone from replay: that proves no removal, and the report says so)."""
        stored_before = math.nextafter(previous.ts, math.inf)
        end = SourceEnd(RESTART if proven else PRESUMED_RESTART, boundary_ts, stored_before, time.time())
        await self.writer.submit(self.state.close_source(source, end, self.holder.current.version))

    async def silent(self, source: str, since: float) -> None:
        batch = self.state.silence(source, since, self.holder.current.version)
        if batch is not None:
            await self.writer.submit(batch)

    async def resumed(self, source: str) -> None:
        batch = self.state.resume(source, time.time(), self.holder.current.version)
        if batch is not None:
            await self.writer.submit(batch)


class WriterReports:
    """The writer's callbacks: metrics for a batch the store accepted, a gap for one the full spool dropped."""

    def __init__(self, state: LedgerState, holder: PolicyHolder, metrics: LedgerMetrics) -> None:
        self.state = state
        self.holder = holder
        self.metrics = metrics

    def applied(self, batch: BatchOps) -> None:
        self.metrics.applied(batch, self.holder.current)
        self.metrics.resident(self.state.resident_counts, self.holder.current)

    def dropped(self, batch: BatchOps) -> None:
        log.warning("ledger_spool_full", source=batch.source, seq=batch.seq, ops=batch.size)
        self.metrics.missing(batch.source, 1)
        self.metrics.spool_dropped(batch.size)
