"""Batched, failure-tolerant writes from ingestion to the store.

Ingestion hands over each batch's operations and goes on; a flush writes whatever is pending in one store
call, at least every `interval_s` (so an event is visible within a second). Whatever the store raises — an
unreachable Redis, a read-only replica, `maxmemory`, SQLite "database is locked", a full disk — the batches
stay here, the error is logged and counted, and the flush is retried with backoff. The spool is bounded in
block events: past the bound a new batch is dropped and recorded as a gap, never silently lost. While the
store is writable but behind, ingestion waits instead.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gateway.ledger.base import LedgerStore, StoreUnavailable
from gateway.ledger.records import BatchOps, GapRecord, SaltDigestEntry
from gateway.log import get_logger

log = get_logger(__name__)
OPS_PER_FLUSH = 50_000


@dataclass(frozen=True)
class Backoff:
    """Retry delays after a failed flush: first, doubled per failure, capped."""

    first_s: float = 0.05
    cap_s: float = 2.0

    def delay(self, failures: int) -> float:
        return min(self.cap_s, self.first_s * float(2.0 ** min(failures - 1, 30)))


def error_kind(error: BaseException) -> str:
    """A short, bounded label for the metric: `unavailable` or the exception class name."""
    return "unavailable" if isinstance(error, StoreUnavailable) else type(error).__name__


class BatchWriter:
    def __init__(
        self, store: LedgerStore, spool_limit: int, on_applied: Callable[[BatchOps], None],
        on_dropped: Callable[[BatchOps], None], on_error: Callable[[str], None] | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.store = store
        self.spool_limit = spool_limit
        self.available = True
        self.failures = 0  # consecutive failed flushes
        self._on_applied = on_applied
        self._on_dropped = on_dropped
        self._on_error = on_error or (lambda _kind: None)
        self._backoff = backoff or Backoff()
        self._pending: deque[BatchOps] = deque()
        self._pending_ops = 0
        self._gaps: list[GapRecord] = []
        self._salts: list[SaltDigestEntry] = []
        self._lock = asyncio.Lock()
        self._drained = asyncio.Event()
        self._wake = asyncio.Event()

    @property
    def pending_ops(self) -> int:
        return self._pending_ops

    async def submit(self, batch: BatchOps) -> None:
        while self.available and self._pending_ops + batch.size > self.spool_limit:
            self._wake.set()
            self._drained.clear()
            await self._drained.wait()
        if self._pending_ops + batch.size > self.spool_limit:
            self._drop(batch)
            return
        self._pending.append(batch)
        self._pending_ops += batch.size

    def _drop(self, batch: BatchOps) -> None:
        self._on_dropped(batch)
        if batch.seq >= 0:
            self.add_gap(GapRecord(batch.source, batch.seq, batch.seq, batch.ts))

    def add_gap(self, gap: GapRecord) -> None:
        self._gaps.append(gap)

    def add_salts(self, entries: Sequence[SaltDigestEntry]) -> None:
        self._salts.extend(entries)

    async def run(self, interval_s: float) -> None:
        while True:
            wait_s = interval_s if self.failures == 0 else self._backoff.delay(self.failures)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=wait_s)
            self._wake.clear()
            # Shielded: cancelling the loop mid-write must not abandon batches the store already took.
            await asyncio.shield(self.flush())

    async def flush(self) -> bool:
        """Write everything pending; False (and everything kept) if the store refused or failed."""
        async with self._lock:
            try:
                await self._flush_side_records()
                while self._pending:
                    await self._flush_some()
                    # A gap (or salt) recorded while that chunk was being written precedes the batches queued
                    # after it: written now, so no report shows those batches without the gap before them.
                    await self._flush_side_records()
            except Exception as error:  # no store error may end ingestion: logged, counted, kept, retried
                self._failed(error)
                return False
            self._set_available(True)
            return True

    async def _flush_side_records(self) -> None:
        if self._salts:
            salts = list(self._salts)
            await self.store.remember_salts(salts)
            del self._salts[: len(salts)]
        if self._gaps:
            gaps = list(self._gaps)
            await self.store.record_gaps(gaps)
            del self._gaps[: len(gaps)]

    async def _flush_some(self) -> None:
        chunk: list[BatchOps] = []
        size = 0
        for batch in self._pending:
            if chunk and size + batch.size > OPS_PER_FLUSH:
                break
            chunk.append(batch)
            size += batch.size
        applied = await self.store.apply(chunk)
        for batch, newly in zip(chunk, applied, strict=True):
            self._pending.popleft()
            self._pending_ops -= batch.size
            if newly:
                self._on_applied(batch)
        self._drained.set()

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        kind = error_kind(error)
        self._on_error(kind)
        if self.available or self.failures in (2, 10) or self.failures % 100 == 0:
            log.warning("ledger_store_write_failed", kind=kind, error=repr(error)[:300], failures=self.failures,
                        spooled_ops=self._pending_ops)
        self._set_available(False)

    def _set_available(self, available: bool) -> None:
        if available and not self.available:
            log.info("ledger_store_available", spooled_ops=self._pending_ops, failed_flushes=self.failures)
        if available:
            self.failures = 0
        self.available = available
        if not available:
            self._drained.set()  # a waiting submit re-checks and spools (or drops) instead of waiting
