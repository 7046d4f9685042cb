"""Values that flow from ingestion to the store and from the store to the audit. Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from gateway.kvevents.media import BlockMedium
from gateway.kvevents.wire import HashValue
from gateway.policy.model import RESERVED_TENANT

CONTROL_SEQ = -1  # seq of a batch the gateway made itself (a restart or a lost source), not vLLM


@dataclass(frozen=True, slots=True)
class Attribution:
    tenant: str
    epoch: int | None  # None when the block matched no salt


UNATTRIBUTED = Attribution(RESERVED_TENANT, None)


class CloseReason(StrEnum):
    """Why a block record closed (stored as its `closed_by`). Only the reasons in CLOSING_REASONS prove it is gone."""

    REMOVED = "removed"  # vLLM's BlockRemoved
    CLEARED = "cleared"  # vLLM's AllBlocksCleared (GPU)
    RESTART = "restart"  # the publisher was proven to be a new process
    RESTART_PRESUMED = "restart_presumed"  # the cursor's batch left replay while later ones exist: not a proof
    RESET = "reset"  # an operator's `kvgate ledger reset-source` (vLLM announces no CPU-tier reset)
    LOST = "lost"  # written by older versions when a source went silent; read, never written now


class SourceEventKind(StrEnum):
    """What happened to a whole source (stored as a `SourceEvent`'s `kind`): the close reasons that end every
    block of a source, and the two changes that only make its blocks unknown and known again."""

    RESTART = CloseReason.RESTART.value
    RESTART_PRESUMED = CloseReason.RESTART_PRESUMED.value
    RESET = CloseReason.RESET.value
    LOST = CloseReason.LOST.value
    SILENT = "silent"  # the source went quiet: its open records became unknown
    RESUMED = "resumed"  # the same publisher process was heard again: its unknown records are resident again


class OpenOp(NamedTuple):
    """A block became resident (a store of a hash already resident on this source and medium is no op)."""

    medium: BlockMedium
    block_hash: HashValue
    parent_hash: HashValue | None
    tenant: str
    epoch: int | None
    stored_at: float


class CloseOp(NamedTuple):
    """A block left its medium; the store closes the open record of (source, medium, hash), if any."""

    medium: BlockMedium
    block_hash: HashValue
    removed_at: float


class ClearOp(NamedTuple):
    """Every open record of the source on `media` (all media when None) stored before `stored_before`."""

    media: tuple[BlockMedium, ...] | None
    stored_before: float | None
    at: float
    reason: CloseReason


class CopiesOp(NamedTuple):
    """The open record of (source, medium, hash) is now held `copies` times by vLLM (persisted, so a gateway
    restart does not close a block at its first removal while another copy is still resident)."""

    medium: BlockMedium
    block_hash: HashValue
    copies: int


class SilenceOp(NamedTuple):
    """The source went silent at `since`: its open records become unknown (not closed)."""

    since: float


class ResumeOp(NamedTuple):
    """The same publisher process is heard again: its unknown records are resident again."""

    at: float


Op = OpenOp | CloseOp | ClearOp | CopiesOp | SilenceOp | ResumeOp
RESTART = CloseReason.RESTART
PRESUMED_RESTART = CloseReason.RESTART_PRESUMED
CLOSING_REASONS = frozenset({CloseReason.REMOVED, CloseReason.CLEARED, CloseReason.RESTART, CloseReason.RESET})
SOURCE_EVENT_KINDS = (CloseReason.RESTART, CloseReason.RESTART_PRESUMED, CloseReason.RESET, CloseReason.LOST)


class Closed(NamedTuple):
    tenant: str
    medium: BlockMedium
    lifetime_s: float
    flagged: bool  # already counted as overdue while resident


@dataclass
class BatchOps:
    """What one vLLM batch (or one gateway-made control batch) changes, in order; idempotent by key."""

    source: str
    seq: int
    ts: float
    policy_version: str
    ops: list[Op] = field(default_factory=list)
    closed: list[Closed] = field(default_factory=list)  # for metrics: records this batch closed

    @property
    def key(self) -> tuple[str, int, float]:
        return (self.source, self.seq, self.ts)

    @property
    def size(self) -> int:
        return max(1, len(self.ops))


@dataclass(frozen=True)
class GapRecord:
    """Batches first..last of a source that were neither received nor recovered; `after_ts` is the ts of the
    batch handled before them, so the same gap seen by two replicas is one record."""

    source: str
    first_seq: int
    last_seq: int
    after_ts: float

    @property
    def missing(self) -> int:
        return self.last_seq - self.first_seq + 1


@dataclass(frozen=True)
class SaltDigestEntry:
    tenant: str
    epoch: int
    digest: bytes


# Records read back from a store keep `closed_by` and `kind` as the strings stored: a ledger may hold values
# written by another version, and the audit reports them rather than failing on them.


@dataclass(frozen=True)
class BlockRecord:
    source: str
    medium: BlockMedium
    tenant: str
    epoch: int | None
    stored_at: float
    removed_at: float | None
    closed_by: str | None
    policy_version: str
    unknown_since: float | None = None  # open, but its source went silent then: held or not is unknown


@dataclass(frozen=True)
class OpenBlock:
    source: str
    medium: BlockMedium
    block_hash: HashValue
    tenant: str
    epoch: int | None
    stored_at: float
    copies: int = 1
    unknown: bool = False


@dataclass(frozen=True)
class SourceEvent:
    """A restart, a silence (`silent`; `lost` before), a resumption or an operator reset, and how many open
    records it closed (or, for `silent`, made unknown)."""

    source: str
    kind: str
    boundary_ts: float
    learned_at: float
    closed: int


@dataclass(frozen=True)
class WindowedRead:
    """What a windowed audit reads: the records resident now or removed in the window, with the gaps, the
    source events and the whole-source changes in progress that agree with them."""

    records: list[BlockRecord]
    missing_batches: dict[str, int]
    source_events: list[SourceEvent]
    changes_in_progress: dict[str, list[str]]
    writes_during_read: int  # store writes that landed while the records were read (0: as of one instant)


@dataclass(frozen=True)
class TenantPolicyRecord:
    """The last policy that named a tenant, kept so a tenant removed from policy is still judged."""

    tenant: str
    retention_s: float | None
    media: tuple[str, ...]
    policy_version: str
    seen_at: float


@dataclass(frozen=True)
class TallyRow:
    """Per (tenant, medium, epoch): counts kept by the store as records open and close (never rescanned)."""

    tenant: str
    medium: BlockMedium
    epoch: int | None
    stored: int
    removed: int
    open: int
    unknown: int
    last_removed_at: float | None
    max_lifetime: float | None


@dataclass(frozen=True)
class CloseCount:
    tenant: str
    medium: BlockMedium
    epoch: int | None
    closed_by: str
    count: int


@dataclass(frozen=True)
class LifetimeStats:
    """Closed records' lifetimes of one (tenant, medium), from 1-second buckets: nearest-rank p50/p99 (the
    longest lifetime in the bucket holding that rank, so at most a second above the exact value), the longest,
    and how many outlived the tenant's retention (exact for whole-second retention)."""

    p50: float
    p99: float
    longest: float
    outlived: int


@dataclass(frozen=True)
class LedgerSummary:
    """What the audit needs without reading every record: incremental tallies, lifetime histograms, and
    per (tenant, medium) the open blocks past retention and the oldest open block, judged on each source's
    clock. Closed records older than `compacted_before` are only in the tallies and histograms."""

    tallies: list[TallyRow]
    closes: list[CloseCount]
    lifetimes: dict[tuple[str, str], LifetimeStats]
    overdue_open: dict[tuple[str, str], int]
    oldest_open_age: dict[tuple[str, str], float]
    compacted_before: float | None
