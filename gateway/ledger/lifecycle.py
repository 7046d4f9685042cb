"""The ledger's state machine: which blocks are resident on each source and medium. Pure.

It turns each decoded vLLM batch into ordered store operations. A hash stored again while resident is
reference-counted (vLLM keeps duplicate blocks and reports each eviction) and counted once; a record
closes when its last copy is removed, when the GPU cache is cleared, or when the source restarts or is lost.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gateway.kvevents.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    HashValue,
    normalize_medium,
)
from gateway.ledger.attribution import KnownHashes, attribute_event
from gateway.ledger.records import (
    CONTROL_SEQ,
    Attribution,
    BatchOps,
    ClearOp,
    Closed,
    CloseOp,
    OpenBlock,
    OpenOp,
)
from gateway.ledger.salts import SaltIndex

GPU_ONLY = ("GPU",)  # AllBlocksCleared comes from vLLM's GPU block pool and has no medium


@dataclass(slots=True)
class Resident:
    tenant: str
    epoch: int | None
    stored_at: float
    copies: int = 1
    overdue: bool = False  # counted once by the retention sweep


BlockKey = tuple[str, HashValue]  # (medium, hash)
SWEEP_CHUNK = 5_000


@dataclass(frozen=True)
class SourceEnd:
    """How an old publisher process ended. `boundary_ts` identifies the event across replicas (the first
    batch of the new process, or the last of the lost one); records stored at or after `stored_before`
    belong to a new process and are spared, so a replica learning late does no harm."""

    reason: str  # restart | lost
    boundary_ts: float
    stored_before: float | None
    learned_at: float


class LedgerState:
    def __init__(self, salts: SaltIndex, known: KnownHashes | None = None) -> None:
        self.salts = salts
        self.known = known or KnownHashes()
        self._sources: dict[str, dict[BlockKey, Resident]] = {}
        self.resident_counts: Counter[tuple[str, str]] = Counter()  # (tenant, medium), kept as blocks move

    def apply(self, source: str, seq: int, batch: EventBatch, policy_version: str) -> BatchOps:
        out = BatchOps(source, seq, batch.ts, policy_version)
        blocks = self._sources.setdefault(source, {})
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(blocks, event, batch.ts, out)
            elif isinstance(event, BlockRemoved):
                self._remove(blocks, event, batch.ts, out)
            elif isinstance(event, AllBlocksCleared):
                self._clear(blocks, GPU_ONLY, None, batch.ts, "cleared", out)
        return out

    def close_source(self, source: str, end: SourceEnd, policy_version: str) -> BatchOps:
        """A restart or lost source: every block of the old process closes when the gateway learned of it."""
        out = BatchOps(source, CONTROL_SEQ, end.boundary_ts, policy_version)
        blocks = self._sources.setdefault(source, {})
        self._clear(blocks, None, end.stored_before, end.learned_at, end.reason, out)
        return out

    def _store(self, blocks: dict[BlockKey, Resident], event: BlockStored, ts: float, out: BatchOps) -> None:
        medium = normalize_medium(event.medium)
        owners = attribute_event(event, self.salts, self.known)
        parent = event.parent_block_hash
        for block_hash, owner in zip(event.block_hashes, owners, strict=True):
            resident = blocks.get((medium, block_hash))
            if resident is not None:
                resident.copies += 1
            else:
                blocks[(medium, block_hash)] = Resident(owner.tenant, owner.epoch, ts)
                self.resident_counts[(owner.tenant, medium)] += 1
                out.ops.append(OpenOp(medium, block_hash, parent, owner.tenant, owner.epoch, ts))
            parent = block_hash

    def _remove(self, blocks: dict[BlockKey, Resident], event: BlockRemoved, ts: float, out: BatchOps) -> None:
        medium = normalize_medium(event.medium)
        for block_hash in event.block_hashes:
            resident = blocks.get((medium, block_hash))
            if resident is not None and resident.copies > 1:
                resident.copies -= 1
                continue
            # Unknown hashes still close: the store may hold a record this process never saw.
            out.ops.append(CloseOp(medium, block_hash, ts))
            if resident is not None:
                del blocks[(medium, block_hash)]
                self._closed(resident, medium, ts, out)

    def _clear(
        self, blocks: dict[BlockKey, Resident], media: tuple[str, ...] | None, stored_before: float | None,
        at: float, reason: str, out: BatchOps,
    ) -> None:
        out.ops.append(ClearOp(media, stored_before, at, reason))
        doomed = [key for key, resident in blocks.items() if _clearable(key, resident, media, stored_before)]
        for key in doomed:
            self._closed(blocks.pop(key), key[0], at, out)

    def _closed(self, resident: Resident, medium: str, at: float, out: BatchOps) -> None:
        self.resident_counts[(resident.tenant, medium)] -= 1
        out.closed.append(Closed(resident.tenant, medium, at - resident.stored_at, resident.overdue))

    def load(self, rows: Iterable[OpenBlock]) -> None:
        """Resume from the store's open records (after a gateway restart)."""
        for row in rows:
            blocks = self._sources.setdefault(row.source, {})
            if (row.medium, row.block_hash) not in blocks:
                self.resident_counts[(row.tenant, row.medium)] += 1
            blocks[(row.medium, row.block_hash)] = Resident(row.tenant, row.epoch, row.stored_at)
            if row.epoch is not None:
                self.known.put(row.block_hash, Attribution(row.tenant, row.epoch))

    def resident(self, source: str) -> dict[BlockKey, Resident]:
        return self._sources.get(source, {})

    def flag_overdue(self, now: float, retention: Mapping[str, float]) -> Iterator[Counter[str]]:
        """Mark resident blocks older than their tenant's retention, a chunk at a time (the caller may
        yield to the event loop between chunks); each block is counted once."""
        for blocks in list(self._sources.values()):
            entries = list(blocks.items())
            for start in range(0, len(entries), SWEEP_CHUNK):
                found: Counter[str] = Counter()
                for key, resident in entries[start : start + SWEEP_CHUNK]:
                    limit = retention.get(resident.tenant)
                    if limit is None or resident.overdue or now - resident.stored_at <= limit:
                        continue
                    if blocks.get(key) is resident:
                        resident.overdue = True
                        found[resident.tenant] += 1
                yield found


def _clearable(key: BlockKey, resident: Resident, media: tuple[str, ...] | None, before: float | None) -> bool:
    return (media is None or key[0] in media) and (before is None or resident.stored_at < before)
