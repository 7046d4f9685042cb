"""Where a batch stands in a publisher's sequence. Pure: the subscriber decides what to do about it.

vLLM numbers batches from 0 per publisher process, so a sequence number alone cannot tell a replayed batch
from a new process's batch. The tracker remembers the timestamp of recent batches it handled: a lower number
whose batch it remembers with the same timestamp is a duplicate, with another timestamp a restart; a lower
number it no longer remembers is `UNCERTAIN`, and the subscriber proves continuity through replay (the batch
at the cursor's own sequence number must be the one handled). Timestamps are never compared for order: a
restarted publisher's clock may be behind.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from dataclasses import dataclass

REMEMBERED_BATCHES = 20_000  # > vLLM's default replay buffer (10,000 batches)


class Verdict(enum.Enum):
    NEXT = "next"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"
    UNCERTAIN = "uncertain"  # below the cursor and not remembered: only replay can tell


@dataclass(frozen=True)
class Cursor:
    """The last batch handled for a source."""

    seq: int
    ts: float
    publisher: bytes = b""


@dataclass(frozen=True)
class Arrival:
    verdict: Verdict
    missing_first: int = 0
    missing_last: int = -1

    @property
    def missing(self) -> int:
        return max(0, self.missing_last - self.missing_first + 1)


class SequenceTracker:
    def __init__(self, cursor: Cursor | None = None, remembered: int = REMEMBERED_BATCHES) -> None:
        self.cursor = cursor
        self._limit = remembered
        self._recent: OrderedDict[int, float] = OrderedDict()  # seq -> ts of batches of this process
        if cursor is not None:
            self._recent[cursor.seq] = cursor.ts

    @property
    def expected(self) -> int:
        """The next sequence number wanted (what a replay request should start at)."""
        return 0 if self.cursor is None else self.cursor.seq + 1

    def classify(self, seq: int, ts: float, publisher: bytes = b"") -> Arrival:
        if self.cursor is None:
            return Arrival(Verdict.NEXT) if seq == 0 else Arrival(Verdict.GAP, 0, seq - 1)
        if publisher and self.cursor.publisher and publisher != self.cursor.publisher:
            return Arrival(Verdict.RESTART)
        if seq < self.expected:
            remembered = self._recent.get(seq)
            if remembered is None:
                return Arrival(Verdict.UNCERTAIN)
            return Arrival(Verdict.DUPLICATE if remembered == ts else Verdict.RESTART)
        if seq > self.expected:
            return Arrival(Verdict.GAP, self.expected, seq - 1)
        return Arrival(Verdict.NEXT)

    def same_batch(self, seq: int, ts: float) -> bool | None:
        """Whether (seq, ts) is a batch this tracker handled; None when it does not remember that seq."""
        remembered = self._recent.get(seq)
        return None if remembered is None else remembered == ts

    def accept(self, seq: int, ts: float, publisher: bytes = b"") -> None:
        self.cursor = Cursor(seq, ts, publisher)
        self._recent[seq] = ts
        self._recent.move_to_end(seq)
        while len(self._recent) > self._limit:
            self._recent.popitem(last=False)

    def forget(self) -> None:
        """After a restart: the new publisher's sequence starts from scratch."""
        self.cursor = None
        self._recent.clear()
