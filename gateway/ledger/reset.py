"""`kvgate ledger reset-source SOURCE --medium CPU`: record a tier reset that vLLM does not announce.

vLLM's `reset_prefix_cache` with the external tier (or an OffloadingConnector restart) empties the CPU tier
without any KV event, so those records would stay open forever. An operator records the reset: every open
record of the source on those media, stored up to now (on the publisher's clock), closes as `reset`. A
running gateway picks the reset up from the store and forgets those blocks, so later stores open new records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.ledger.base import LedgerStore
from gateway.ledger.records import CONTROL_SEQ, BatchOps, ClearOp, CloseReason, SourceEventKind

OPERATOR_VERSION = "operator-reset"


class ResetError(Exception):
    pass


@dataclass(frozen=True)
class ResetResult:
    source: str
    media: tuple[str, ...]
    closed: int
    stored_before: float
    clock_offset_s: float | None


async def reset_source(
    store: LedgerStore, source: str, media: tuple[str, ...], now: float | None = None,
) -> ResetResult:
    if source not in await _known_sources(store):
        raise ResetError(f"unknown source {source!r}: the ledger has no cursor or open record for it")
    at = time.time() if now is None else now
    offset = (await store.clock_offsets()).get(source)
    stored_before = at - (offset or 0.0)  # the publisher's clock: what it stored before the reset
    batch = BatchOps(source, CONTROL_SEQ, at, OPERATOR_VERSION, [ClearOp(media, stored_before, at, CloseReason.RESET)])
    await store.apply([batch])
    closed = sum(event.closed for event in await store.source_events()
                 if event.source == source and event.kind == SourceEventKind.RESET and event.boundary_ts == at)
    return ResetResult(source, media, closed, stored_before, offset)


async def _known_sources(store: LedgerStore) -> set[str]:
    return set(await store.cursors()) | {block.source for block in await store.open_blocks()}
