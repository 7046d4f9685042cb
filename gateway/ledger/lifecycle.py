"""The ledger's state machine: which blocks are resident on each source and medium. Pure.

It turns each decoded vLLM batch into ordered store operations. A hash stored again while resident is
reference-counted (vLLM keeps duplicate blocks and reports each eviction), counted once, and its copy count
is persisted. A record closes only when its last copy is removed, when the GPU cache is cleared, when the
source provably restarted, or when an operator records a tier reset. A source that goes silent does not
close anything: its blocks become unknown, and are resident again when the same process is heard from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from gateway.kvevents.media import GPU, BlockMedium
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
    CloseReason,
    CopiesOp,
    OpenBlock,
    OpenOp,
    ResumeOp,
    SilenceOp,
)
from gateway.ledger.salts import SaltIndex

GPU_ONLY: tuple[BlockMedium, ...] = (GPU,)  # AllBlocksCleared comes from vLLM's GPU block pool and has no medium


@dataclass(slots=True)
class Resident:
    tenant: str
    epoch: int | None
    stored_at: float
    copies: int = 1
    overdue: bool = False  # counted once by the retention sweep


BlockKey = tuple[BlockMedium, HashValue]
SWEEP_CHUNK = 5_000


@dataclass(frozen=True)
class SourceEnd:
    """How an old publisher process ended. `boundary_ts` identifies the event across replicas (the first
    batch of the new process, or the old cursor); records stored at or after `stored_before` belong to a new
    process and are spared, so a replica learning late does no harm. `reason`: restart or reset."""

    reason: CloseReason
    boundary_ts: float
    stored_before: float | None
    learned_at: float
    media: tuple[BlockMedium, ...] | None = None


class ResidentOwners:
    """hash -> owner of blocks resident now, on any source and medium (reference-counted): attribution asks
    this before the bounded cache, so a resident block never loses its owner to eviction from the cache."""

    def __init__(self) -> None:
        self._owners: dict[HashValue, tuple[Attribution, int]] = {}

    def add(self, block_hash: HashValue, owner: Attribution) -> None:
        if owner.epoch is None:
            return
        found = self._owners.get(block_hash)
        self._owners[block_hash] = (owner, 1) if found is None else (found[0], found[1] + 1)

    def discard(self, block_hash: HashValue, owner: Attribution) -> None:
        found = self._owners.get(block_hash)
        if found is None or owner.epoch is None:
            return
        if found[1] <= 1:
            del self._owners[block_hash]
        else:
            self._owners[block_hash] = (found[0], found[1] - 1)

    def get(self, block_hash: HashValue | None) -> Attribution | None:
        found = None if block_hash is None else self._owners.get(block_hash)
        return None if found is None else found[0]


class LedgerState:
    def __init__(self, salts: SaltIndex, known: KnownHashes | None = None) -> None:
        self.salts = salts
        self.known = known if known is not None else KnownHashes()  # an empty cache is falsy: test for None
        self.owners = ResidentOwners()
        self._sources: dict[str, dict[BlockKey, Resident]] = {}
        self.silent: set[str] = set()  # sources whose open records are unknown now
        self.resident_counts: Counter[tuple[str, BlockMedium]] = Counter()  # (tenant, medium), kept as blocks move

    def apply(self, source: str, seq: int, batch: EventBatch, policy_version: str) -> BatchOps:
        out = BatchOps(source, seq, batch.ts, policy_version)
        if source in self.silent:  # the same process's stream continues: what was unknown is resident
            self.silent.discard(source)
            out.ops.append(ResumeOp(batch.ts))
        blocks = self._sources.setdefault(source, {})
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(blocks, event, batch.ts, out)
            elif isinstance(event, BlockRemoved):
                self._remove(blocks, event, batch.ts, out)
            elif isinstance(event, AllBlocksCleared):
                self._clear(blocks, GPU_ONLY, None, batch.ts, CloseReason.CLEARED, out)
        return out

    def close_source(self, source: str, end: SourceEnd, policy_version: str) -> BatchOps:
        """A proven restart (or an operator's reset): the old process's blocks close when the gateway learned."""
        out = BatchOps(source, CONTROL_SEQ, end.boundary_ts, policy_version)
        blocks = self._sources.setdefault(source, {})
        if end.media is None:
            self.silent.discard(source)
        self._clear(blocks, end.media, end.stored_before, end.learned_at, end.reason, out)
        return out

    def silence(self, source: str, since: float, policy_version: str) -> BatchOps | None:
        """The source stopped answering: its open records become unknown from `since`."""
        if source in self.silent:
            return None
        self.silent.add(source)
        return BatchOps(source, CONTROL_SEQ, since, policy_version, [SilenceOp(since)])

    def resume(self, source: str, at: float, policy_version: str) -> BatchOps | None:
        """Continuity with the same process is proven again (no new batch needed)."""
        if source not in self.silent:
            return None
        self.silent.discard(source)
        return BatchOps(source, CONTROL_SEQ, at, policy_version, [ResumeOp(at)])

    def _store(self, blocks: dict[BlockKey, Resident], event: BlockStored, ts: float, out: BatchOps) -> None:
        medium = normalize_medium(event.medium)
        owners = attribute_event(event, self.salts, self.known, self.owners.get)
        parent = event.parent_block_hash
        for block_hash, owner in zip(event.block_hashes, owners, strict=True):
            resident = blocks.get((medium, block_hash))
            if resident is not None:
                resident.copies += 1
                out.ops.append(CopiesOp(medium, block_hash, resident.copies))
            else:
                blocks[(medium, block_hash)] = Resident(owner.tenant, owner.epoch, ts)
                self.owners.add(block_hash, owner)
                self.resident_counts[(owner.tenant, medium)] += 1
                out.ops.append(OpenOp(medium, block_hash, parent, owner.tenant, owner.epoch, ts))
            parent = block_hash

    def _remove(self, blocks: dict[BlockKey, Resident], event: BlockRemoved, ts: float, out: BatchOps) -> None:
        medium = normalize_medium(event.medium)
        for block_hash in event.block_hashes:
            resident = blocks.get((medium, block_hash))
            if resident is not None and resident.copies > 1:
                resident.copies -= 1
                out.ops.append(CopiesOp(medium, block_hash, resident.copies))
                continue
            # Unknown hashes still close: the store may hold a record this process never saw.
            out.ops.append(CloseOp(medium, block_hash, ts))
            if resident is not None:
                del blocks[(medium, block_hash)]
                self._closed(resident, medium, block_hash, ts, out)

    def _clear(
        self, blocks: dict[BlockKey, Resident], media: tuple[BlockMedium, ...] | None, stored_before: float | None,
        at: float, reason: CloseReason, out: BatchOps,
    ) -> None:
        out.ops.append(ClearOp(media, stored_before, at, reason))
        doomed = [key for key, resident in blocks.items() if _clearable(key, resident, media, stored_before)]
        for key in doomed:
            self._closed(blocks.pop(key), key[0], key[1], at, out)

    def _closed(self, resident: Resident, medium: BlockMedium, block_hash: HashValue, at: float, out: BatchOps) -> None:
        self.resident_counts[(resident.tenant, medium)] -= 1
        self.owners.discard(block_hash, Attribution(resident.tenant, resident.epoch))
        out.closed.append(Closed(resident.tenant, medium, at - resident.stored_at, resident.overdue))

    def load(self, rows: Iterable[OpenBlock]) -> None:
        """Resume from the store's open records (after a gateway restart), copy counts and silences included."""
        for row in rows:
            blocks = self._sources.setdefault(row.source, {})
            key = (row.medium, row.block_hash)
            if key not in blocks:
                self.resident_counts[(row.tenant, row.medium)] += 1
                self.owners.add(row.block_hash, Attribution(row.tenant, row.epoch))
            blocks[key] = Resident(row.tenant, row.epoch, row.stored_at, max(1, row.copies))
            if row.unknown:
                self.silent.add(row.source)

    def replace_source(self, source: str, rows: Iterable[OpenBlock]) -> None:
        """Take a source's open blocks from the store again (after another process closed some of them, as
        `kvgate ledger reset-source` does), so a later store of a closed hash opens a new record."""
        for (medium, block_hash), resident in self._sources.pop(source, {}).items():
            self.resident_counts[(resident.tenant, medium)] -= 1
            self.owners.discard(block_hash, Attribution(resident.tenant, resident.epoch))
        self.silent.discard(source)
        self.load(rows)

    def resident(self, source: str) -> dict[BlockKey, Resident]:
        return self._sources.get(source, {})

    def flag_overdue(
        self, now: float, retention: Mapping[str, float], offsets: Mapping[str, float] | None = None,
    ) -> Iterator[Counter[str]]:
        """Mark resident blocks older than their tenant's retention, a chunk at a time (the caller may
        yield to the event loop between chunks); each block is counted once. Ages are on the publisher's
        clock: `now` minus the source's estimated clock offset."""
        for source, blocks in list(self._sources.items()):
            source_now = now - (offsets or {}).get(source, 0.0)
            entries = list(blocks.items())
            for start in range(0, len(entries), SWEEP_CHUNK):
                found: Counter[str] = Counter()
                for key, resident in entries[start : start + SWEEP_CHUNK]:
                    limit = retention.get(resident.tenant)
                    if limit is None or resident.overdue or source_now - resident.stored_at <= limit:
                        continue
                    if blocks.get(key) is resident:
                        resident.overdue = True
                        found[resident.tenant] += 1
                yield found


def _clearable(key: BlockKey, resident: Resident, media: tuple[BlockMedium, ...] | None, before: float | None) -> bool:
    return (media is None or key[0] in media) and (before is None or resident.stored_at < before)
