"""Where a batch stands in a publisher's sequence. Pure: the subscriber decides what to do about it.

vLLM numbers batches from 0 per publisher process. A lower number with a later timestamp, or a new publisher
id, means the publisher restarted; a lower number with an earlier-or-equal timestamp is a batch already seen
(replay overlap or the live copy of a replayed batch).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Verdict(enum.Enum):
    NEXT = "next"
    DUPLICATE = "duplicate"
    GAP = "gap"
    RESTART = "restart"


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
    def __init__(self, cursor: Cursor | None = None) -> None:
        self.cursor = cursor

    @property
    def expected(self) -> int:
        """The next sequence number wanted (what a replay request should start at)."""
        return 0 if self.cursor is None else self.cursor.seq + 1

    def classify(self, seq: int, ts: float, publisher: bytes = b"") -> Arrival:
        if self.cursor is not None and self._restarted(seq, ts, publisher):
            return Arrival(Verdict.RESTART)
        if seq < self.expected:
            return Arrival(Verdict.DUPLICATE)
        if seq > self.expected:
            return Arrival(Verdict.GAP, self.expected, seq - 1)
        return Arrival(Verdict.NEXT)

    def _restarted(self, seq: int, ts: float, publisher: bytes) -> bool:
        assert self.cursor is not None
        if publisher and self.cursor.publisher and publisher != self.cursor.publisher:
            return True
        return seq <= self.cursor.seq and ts > self.cursor.ts

    def accept(self, seq: int, ts: float, publisher: bytes = b"") -> None:
        self.cursor = Cursor(seq, ts, publisher)

    def forget(self) -> None:
        """After a restart: the new publisher's sequence starts from scratch."""
        self.cursor = None
