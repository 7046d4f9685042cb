"""The audit report (contract §6) from block records. Pure: records, policies and a clock in; JSON out.

Window semantics with `since`: stored = stored at or after it; removed, lifetimes and closed_by = removed at
or after it; resident = resident now. Violations are judged now, against the policy in force now: a resident
block older than `retention_seconds`, or a block removed in the window that lived longer; and every block
in the window on a medium outside `allowed_media`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gateway.kvevents.endpoints import plan_sources
from gateway.kvevents.formats.lmcache import UNOBSERVED
from gateway.ledger.records import BlockRecord, SourceEvent
from gateway.policy.loader import PolicySet
from gateway.policy.model import RESERVED_TENANT, TenantPolicy

BASE_MEDIA = ("GPU", "CPU")


@dataclass
class EpochTally:
    stored: int = 0
    removed: int = 0
    resident: int = 0
    last_removed_at: float | None = None


@dataclass
class MediumTally:
    stored: int = 0
    removed: int = 0
    resident: int = 0
    lifetimes: list[float] = field(default_factory=list)
    oldest_stored_at: float | None = None
    age_violations: int = 0
    medium_violations: int = 0
    closed_by: Counter[str] = field(default_factory=Counter)
    epochs: dict[int, EpochTally] = field(default_factory=dict)


@dataclass(frozen=True)
class Window:
    now: float
    since: float | None

    def includes(self, ts: float | None) -> bool:
        return ts is not None and (self.since is None or ts >= self.since)


@dataclass(frozen=True)
class AuditInputs:
    records: Iterable[BlockRecord]
    missing_batches: dict[str, int]
    source_events: list[SourceEvent]


def build_report(inputs: AuditInputs, policies: PolicySet, window: Window, tenant: str | None) -> dict[str, Any]:
    tallies = _tally(inputs.records, policies, window)
    names = _tenant_names(policies, tallies, tenant)
    return {
        "generated_at": iso(window.now),
        "policy_version": policies.version,
        "since": iso(window.since) if window.since is not None else None,
        "gaps": _gaps(policies, inputs),
        # What the events of LMCache pools never report: such blocks stay resident here, never shown removed.
        "unobserved": {name: list(UNOBSERVED) for name, pool in policies.gateway.pools.items() if pool.lmcache},
        "tenants": {name: _tenant_view(policies.tenants.get(name), tallies.get(name, {}), window)
                    for name in names},
    }


def _tally(records: Iterable[BlockRecord], policies: PolicySet, window: Window) -> dict[str, dict[str, MediumTally]]:
    tallies: dict[str, dict[str, MediumTally]] = {}
    for record in records:
        tally = tallies.setdefault(record.tenant, {}).setdefault(record.medium, MediumTally())
        _count(tally, record, policies.tenants.get(record.tenant), window)
    return tallies


def _count(tally: MediumTally, record: BlockRecord, policy: TenantPolicy | None, window: Window) -> None:
    stored_now = window.includes(record.stored_at)
    removed_now = window.includes(record.removed_at)
    resident = record.removed_at is None
    tally.stored += stored_now
    tally.removed += removed_now
    tally.resident += resident
    if removed_now:
        assert record.removed_at is not None
        tally.lifetimes.append(record.removed_at - record.stored_at)
        tally.closed_by[record.closed_by or "removed"] += 1
    if resident and (tally.oldest_stored_at is None or record.stored_at < tally.oldest_stored_at):
        tally.oldest_stored_at = record.stored_at
    if policy is not None and (resident or removed_now):
        tally.age_violations += _outlived(record, policy, window.now)
        tally.medium_violations += record.medium not in policy.offload.allowed_media
    if record.epoch is not None:
        _count_epoch(tally.epochs.setdefault(record.epoch, EpochTally()), record, stored_now, removed_now)


def _count_epoch(epoch: EpochTally, record: BlockRecord, stored_now: bool, removed_now: bool) -> None:
    epoch.stored += stored_now
    epoch.removed += removed_now
    epoch.resident += record.removed_at is None
    if record.removed_at is not None and (epoch.last_removed_at is None or record.removed_at > epoch.last_removed_at):
        epoch.last_removed_at = record.removed_at


def _outlived(record: BlockRecord, policy: TenantPolicy, now: float) -> bool:
    limit = policy.offload.retention_seconds
    end = now if record.removed_at is None else record.removed_at
    return limit is not None and end - record.stored_at > limit


def _tenant_names(policies: PolicySet, tallies: dict[str, Any], only: str | None) -> list[str]:
    names = sorted(set(policies.tenants) | set(tallies) - {RESERVED_TENANT})
    if RESERVED_TENANT in tallies:
        names.append(RESERVED_TENANT)
    return [name for name in names if only is None or name == only]


def _tenant_view(policy: TenantPolicy | None, media: dict[str, MediumTally], window: Window) -> dict[str, Any]:
    allowed = tuple(policy.offload.allowed_media) if policy is not None else ()
    names = list(BASE_MEDIA) + sorted((set(allowed) | set(media)) - set(BASE_MEDIA))
    return {name: _medium_view(media.get(name, MediumTally()), window) for name in names}


def _medium_view(tally: MediumTally, window: Window) -> dict[str, Any]:
    lifetimes = sorted(tally.lifetimes)
    oldest = 0.0 if tally.oldest_stored_at is None else window.now - tally.oldest_stored_at
    return {
        "stored": tally.stored, "removed": tally.removed, "resident": tally.resident,
        "lifetime_p50_s": _percentile(lifetimes, 0.50), "lifetime_p99_s": _percentile(lifetimes, 0.99),
        "lifetime_max_s": round(lifetimes[-1], 3) if lifetimes else 0.0,
        "oldest_resident_age_s": round(max(oldest, 0.0), 3),
        "violations": {"age": tally.age_violations, "medium": tally.medium_violations},
        "closed_by": dict(sorted(tally.closed_by.items())),
        "epochs": {str(number): _epoch_view(epoch) for number, epoch in sorted(tally.epochs.items())},
    }


def _epoch_view(epoch: EpochTally) -> dict[str, Any]:
    drained_at = iso(epoch.last_removed_at) if epoch.resident == 0 and epoch.last_removed_at else None
    return {"stored": epoch.stored, "removed": epoch.removed, "resident": epoch.resident,
            "last_removed_at": iso(epoch.last_removed_at) if epoch.last_removed_at else None,
            "drained_at": drained_at}


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile: a lifetime that actually occurred."""
    if not ordered:
        return 0.0
    return round(ordered[max(0, math.ceil(fraction * len(ordered)) - 1)], 3)


def _gaps(policies: PolicySet, inputs: AuditInputs) -> list[dict[str, Any]]:
    sources = [spec.name for spec in plan_sources(policies.gateway)]
    extra = (set(inputs.missing_batches) | {event.source for event in inputs.source_events}) - set(sources)
    return [_gap_view(source, inputs) for source in [*sources, *sorted(extra)]]


def _gap_view(source: str, inputs: AuditInputs) -> dict[str, Any]:
    events = [event for event in inputs.source_events if event.source == source]
    return {
        "source": source,
        "missing_batches": inputs.missing_batches.get(source, 0),
        "restarts": sum(event.kind == "restart" for event in events),
        "lost": sum(event.kind == "lost" for event in events),
        "closed_without_removal": sum(event.closed for event in events),
        "last_restart_or_loss_at": iso(max(event.learned_at for event in events)) if events else None,
    }


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
