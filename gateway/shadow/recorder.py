"""Shadow results leave the request path at memory speed; one owned task writes them to the store in batches.

A store write per pair (a thread hop for SQLite, a round trip for Redis) cost about as much as the rest of
the shadow's bookkeeping, so settled pairs and outcome counts gather in memory for `flush_interval_s` and go
out in one transaction. A report flushes first, so a replica always reads its own results; shutdown writes
whatever is left. When the store fails, the batch is kept (pairs up to MAX_PENDING_PAIRS) and tried again.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from gateway.log import get_logger
from gateway.shadow.compare import PairRecord
from gateway.shadow.store import ShadowStore

MAX_PENDING_PAIRS = 10_000  # while the store is unreachable; the oldest pairs beyond this are given up
RETRY_S = 1.0

log = get_logger(__name__)


class ShadowRecorder:
    def __init__(self, store: ShadowStore, flush_interval_s: float) -> None:
        self.store = store
        self.flush_interval_s = flush_interval_s
        self._pairs: list[PairRecord] = []
        self._counts: Counter[tuple[str, str]] = Counter()
        self._pending = asyncio.Event()
        self._writing = asyncio.Lock()

    def add_pair(self, pair: PairRecord) -> None:
        """Record a compared pair (and count it as `compared`)."""
        self._pairs.append(pair)
        self.count(pair.tenant, "compared")
        self._bound()

    def count(self, tenant: str, outcome: str) -> None:
        self._counts[tenant, outcome] += 1
        self._pending.set()

    async def run(self) -> None:
        """The writer loop; owned by the gateway's task supervisor, cancelled at shutdown."""
        while True:
            await self._pending.wait()
            await asyncio.sleep(self.flush_interval_s)  # lets a batch gather: one write per interval
            # Shielded: a write cancelled at shutdown would lose its batch (or, half-done, write it twice);
            # shielded, it completes, and the final flush in `close` waits for it on the lock.
            if not await asyncio.shield(self.flush()):
                await asyncio.sleep(RETRY_S)

    async def flush(self) -> bool:
        """Write everything recorded so far; False (and everything kept) if the store failed."""
        async with self._writing:
            pairs, counts = self._take()
            if not pairs and not counts:
                return True
            try:
                await self.store.write(pairs, dict(counts))
            except Exception as error:  # Redis or SQLite trouble must not lose results or stop the writer
                self._put_back(pairs, counts)
                log.warning("shadow_store_write_failed", pairs=len(pairs), error=type(error).__name__)
                return False
            return True

    async def close(self) -> None:
        """Write whatever is still held, then close the store. Call after the writer loop is cancelled."""
        await self.flush()
        await self.store.close()

    def _take(self) -> tuple[list[PairRecord], Counter[tuple[str, str]]]:
        pairs, self._pairs = self._pairs, []
        counts, self._counts = self._counts, Counter()
        self._pending.clear()
        return pairs, counts

    def _put_back(self, pairs: list[PairRecord], counts: Counter[tuple[str, str]]) -> None:
        self._pairs[:0] = pairs
        self._counts.update(counts)
        self._pending.set()
        self._bound()

    def _bound(self) -> None:
        excess = len(self._pairs) - MAX_PENDING_PAIRS
        if excess > 0:
            del self._pairs[:excess]
            log.warning("shadow_pairs_given_up", given_up=excess, kept=MAX_PENDING_PAIRS)
