"""The ledger store interface. Two backends implement it: `sqlite_store` (embedded, default) and
`redis_store` (shared by several gateway replicas); `tests/ledger/test_store_conformance.py` holds both to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.kvevents.sequence import Cursor
from gateway.ledger.records import (
    BatchOps,
    BlockRecord,
    GapRecord,
    OpenBlock,
    SaltDigestEntry,
    SourceEvent,
    TenantPolicyRecord,
    WindowedRead,
)


class StoreUnavailable(Exception):
    """The backend cannot be reached now; the caller keeps its writes and tries again later."""


class AuditReadRaced(Exception):
    """The ledger's sources kept changing state (silenced, resumed, restarted) while the records were read."""


class LedgerStore(Protocol):
    async def apply(self, batches: Sequence[BatchOps]) -> list[bool]:
        """Apply each batch's operations in order, atomically per batch, unless a batch with the same
        (source, seq, ts) was applied before; True for each batch applied now. `ts` tells two publisher
        processes' batches of the same seq apart; two sources never share a marker."""
        ...

    async def record_gaps(self, gaps: Sequence[GapRecord]) -> None:
        """Idempotent: the same gap recorded twice (two replicas) is one gap."""
        ...

    async def remember_salts(self, entries: Sequence[SaltDigestEntry]) -> None: ...

    async def salt_entries(self, after: int) -> tuple[list[SaltDigestEntry], int]:
        """Salt digests added after position `after`, and the position to ask from next time."""
        ...

    async def cursors(self) -> dict[str, Cursor]:
        """Per source, the latest batch applied (by vLLM time), to resume and ask replay from."""
        ...

    async def open_blocks(self) -> list[OpenBlock]: ...

    async def records(self, since: float | None, tenant: str | None) -> list[BlockRecord]:
        """Records resident now or removed at or after `since` (all records when None)."""
        ...

    async def windowed_read(self, since: float | None, tenant: str | None) -> WindowedRead:
        """`records(since, tenant)` with the gaps, source events and changes in progress that agree with them
        (no record unknown without its silence's event); raises `AuditReadRaced` when that cannot be had."""
        ...

    async def missing_batches(self) -> dict[str, int]: ...

    async def source_events(self) -> list[SourceEvent]: ...

    async def record_clock(self, offsets: dict[str, float], at: float) -> None:
        """Per source, the estimated publisher clock offset (gateway time - publisher time), in seconds."""
        ...

    async def clock_offsets(self) -> dict[str, float]: ...

    async def remember_policies(self, entries: Sequence[TenantPolicyRecord]) -> None:
        """The policy that last named each tenant (upserted)."""
        ...

    async def tenant_policies(self) -> dict[str, TenantPolicyRecord]: ...

    async def close(self) -> None: ...
