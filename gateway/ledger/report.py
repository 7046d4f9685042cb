"""The audit report (docs/reports.md) from block records. Pure: records, policies and a clock in; JSON out.

Window semantics with `since`: stored = stored at or after it; removed, lifetimes and closed_by = removed at
or after it; resident and unknown = open now (unknown: its source went silent, so whether vLLM still holds it
is not known). Violations are judged now, against the policy in force now (or, for a tenant no longer in the
policy set, the last policy that named it): an open block older than `retention_seconds`, or a block removed
in the window that lived longer; and every block in the window on a medium outside `allowed_media`. Ages use
one clock, the publisher's: block times are vLLM's, and "now" is the gateway's time minus the source's
estimated clock offset.

An epoch's `drained_at` is given only when the drain is proven: no block of it open or unknown, every block
closed by a removal, a cache clear, a proven restart or an operator reset, and no unrecovered gap on any
source. Otherwise `drain.reasons` says why not.
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
from gateway.kvevents.media import CPU, GPU
from gateway.ledger.records import (
    CLOSING_REASONS,
    SOURCE_EVENT_KINDS,
    BlockRecord,
    CloseReason,
    LedgerSummary,
    LifetimeStats,
    SourceEvent,
    SourceEventKind,
    TenantPolicyRecord,
)
from gateway.policy.loader import PolicySet
from gateway.policy.model import RESERVED_TENANT, TenantPolicy

BASE_MEDIA = (GPU, CPU)
NOT_AUDITABLE = "not auditable (no salt)"


@dataclass
class EpochTally:
    stored: int = 0
    removed: int = 0
    resident: int = 0
    unknown: int = 0
    unproven_closes: Counter[str] = field(default_factory=Counter)  # closed_by values that prove nothing
    last_removed_at: float | None = None


@dataclass
class MediumTally:
    stored: int = 0
    removed: int = 0
    resident: int = 0
    unknown: int = 0
    lifetimes: list[float] = field(default_factory=list)
    summarised: LifetimeStats | None = None  # from the store's histograms instead of `lifetimes`
    oldest_age: float | None = None  # of open blocks, on their publisher's clock
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
class Judge:
    """What a tenant's blocks are judged against: its policy now, or the last one that named it."""

    retention_s: float | None
    media: tuple[str, ...]
    in_force: bool
    policy_version: str


@dataclass(frozen=True)
class AuditInputs:
    records: Iterable[BlockRecord]
    missing_batches: dict[str, int]
    source_events: list[SourceEvent]
    clock_offsets: dict[str, float] = field(default_factory=dict)
    last_policies: dict[str, TenantPolicyRecord] = field(default_factory=dict)
    changes_in_progress: dict[str, list[str]] = field(default_factory=dict)
    writes_during_read: int = 0  # store writes that landed while the records were read in pages


def build_report(inputs: AuditInputs, policies: PolicySet, window: Window, tenant: str | None) -> dict[str, Any]:
    judges = _judges(policies, inputs.last_policies)
    tallies = _tally(inputs.records, judges, window, inputs.clock_offsets)
    names = _tenant_names(policies, tallies, tenant)
    gap_reasons = [f"unrecovered gap of {count} batches on {source}"
                   for source, count in sorted(inputs.missing_batches.items()) if count > 0]
    return {
        "generated_at": iso(window.now),
        "policy_version": policies.version,
        "since": iso(window.since) if window.since is not None else None,
        "writes_during_read": inputs.writes_during_read,
        "gaps": _gaps(policies, inputs),
        # What the events of LMCache pools never report: such blocks stay resident here, never shown removed.
        "unobserved": _unobserved(policies),
        "tenants": {name: _tenant_view(judges.get(name), tallies.get(name, {}), window, gap_reasons,
                                       policies.tenants.get(name))
                    for name in names},
        "judged_against_last_policy": {name: judges[name].policy_version for name in names
                                       if name in judges and not judges[name].in_force},
    }


def _unobserved(policies: PolicySet) -> dict[str, list[str]]:
    return {name: list(UNOBSERVED) for name, pool in policies.gateway.pools.items() if pool.lmcache}


def _judges(policies: PolicySet, last: dict[str, TenantPolicyRecord]) -> dict[str, Judge]:
    judges = {name: Judge(record.retention_s, record.media, False, record.policy_version)
              for name, record in last.items() if name not in policies.tenants}
    for name, policy in policies.tenants.items():
        judges[name] = Judge(policy.offload.retention_seconds, tuple(policy.offload.allowed_media), True,
                             policies.version)
    return judges


def _tally(
    records: Iterable[BlockRecord], judges: dict[str, Judge], window: Window, offsets: dict[str, float],
) -> dict[str, dict[str, MediumTally]]:
    tallies: dict[str, dict[str, MediumTally]] = {}
    for record in records:
        tally = tallies.setdefault(record.tenant, {}).setdefault(record.medium, MediumTally())
        _count(tally, record, judges.get(record.tenant), window.now - offsets.get(record.source, 0.0), window)
    return tallies


def _count(tally: MediumTally, record: BlockRecord, judge: Judge | None, now: float, window: Window) -> None:
    """`now` is on the publisher's clock (the source's offset taken off the gateway's time)."""
    stored_now = window.includes(record.stored_at)
    removed_now = window.includes(record.removed_at)
    open_now = record.removed_at is None
    unknown = open_now and record.unknown_since is not None
    tally.stored += stored_now
    tally.removed += removed_now
    tally.resident += open_now and not unknown
    tally.unknown += unknown
    if removed_now:
        assert record.removed_at is not None
        tally.lifetimes.append(record.removed_at - record.stored_at)
        tally.closed_by[record.closed_by or CloseReason.REMOVED] += 1
    if open_now:
        age = now - record.stored_at
        if tally.oldest_age is None or age > tally.oldest_age:
            tally.oldest_age = age
    if judge is not None and (open_now or removed_now):
        tally.age_violations += _outlived(record, judge, now)
        tally.medium_violations += record.medium not in judge.media
    if record.epoch is not None:
        _count_epoch(tally.epochs.setdefault(record.epoch, EpochTally()), record, stored_now, removed_now)


def _count_epoch(epoch: EpochTally, record: BlockRecord, stored_now: bool, removed_now: bool) -> None:
    epoch.stored += stored_now
    epoch.removed += removed_now
    if record.removed_at is None:
        epoch.resident += record.unknown_since is None
        epoch.unknown += record.unknown_since is not None
        return
    if (record.closed_by or CloseReason.REMOVED) not in CLOSING_REASONS:
        epoch.unproven_closes[record.closed_by or "?"] += 1
    if epoch.last_removed_at is None or record.removed_at > epoch.last_removed_at:
        epoch.last_removed_at = record.removed_at


def _outlived(record: BlockRecord, judge: Judge, now: float) -> bool:
    limit = judge.retention_s
    end = now if record.removed_at is None else record.removed_at
    return limit is not None and end - record.stored_at > limit


def _tenant_names(policies: PolicySet, tallies: dict[str, Any], only: str | None) -> list[str]:
    names = sorted(set(policies.tenants) | set(tallies) - {RESERVED_TENANT})
    if RESERVED_TENANT in tallies:
        names.append(RESERVED_TENANT)
    return [name for name in names if only is None or name == only]


def _tenant_view(
    judge: Judge | None, media: dict[str, MediumTally], window: Window, gap_reasons: list[str],
    policy: TenantPolicy | None = None,
) -> dict[str, Any]:
    if policy is not None and policy.cache.isolation == "none":
        return {"not_auditable": NOT_AUDITABLE}  # its blocks carry no salt: they are under `unattributed`
    allowed = judge.media if judge is not None else ()
    names = list(BASE_MEDIA) + sorted((set(allowed) | set(media)) - set(BASE_MEDIA))
    return {name: _medium_view(media.get(name, MediumTally()), gap_reasons) for name in names}


def _medium_view(tally: MediumTally, gap_reasons: list[str]) -> dict[str, Any]:
    """Lifetimes are null when no block was removed in the window, and the oldest age null when no block is
    open: nothing was observed, which a 0 would misreport as an instant lifetime or a fresh block."""
    p50, p99, longest = _lifetimes(tally)
    oldest = None if tally.oldest_age is None else round(max(tally.oldest_age, 0.0), 3)
    return {
        "stored": tally.stored, "removed": tally.removed, "resident": tally.resident, "unknown": tally.unknown,
        "lifetime_p50_s": p50, "lifetime_p99_s": p99, "lifetime_max_s": longest,
        "oldest_resident_age_s": oldest,
        "violations": {"age": tally.age_violations, "medium": tally.medium_violations},
        "closed_by": dict(sorted(tally.closed_by.items())),
        "epochs": {str(number): _epoch_view(epoch, gap_reasons) for number, epoch in sorted(tally.epochs.items())},
    }


def _lifetimes(tally: MediumTally) -> tuple[float | None, float | None, float | None]:
    """p50, p99 and max lifetime of the blocks removed in the window; all None when none was."""
    if tally.summarised is not None and tally.removed > 0:
        stats = tally.summarised
        return round(stats.p50, 3), round(stats.p99, 3), round(stats.longest, 3)
    if not tally.lifetimes:
        return None, None, None
    lifetimes = sorted(tally.lifetimes)
    return _percentile(lifetimes, 0.50), _percentile(lifetimes, 0.99), round(lifetimes[-1], 3)


def _epoch_view(epoch: EpochTally, gap_reasons: list[str]) -> dict[str, Any]:
    reasons = drain_reasons(epoch, gap_reasons)
    proven = not reasons and epoch.last_removed_at is not None
    return {"stored": epoch.stored, "removed": epoch.removed, "resident": epoch.resident, "unknown": epoch.unknown,
            "last_removed_at": iso(epoch.last_removed_at) if epoch.last_removed_at else None,
            "drained_at": iso(epoch.last_removed_at) if proven and epoch.last_removed_at else None,
            "drain": {"proven": proven, "reasons": reasons}}


def drain_reasons(epoch: EpochTally, gap_reasons: list[str]) -> list[str]:
    """Why an epoch's drain is not proven (empty when it is)."""
    reasons = []
    if epoch.resident:
        reasons.append(f"{epoch.resident} blocks resident")
    if epoch.unknown:
        reasons.append(f"{epoch.unknown} blocks unknown (their source went silent)")
    for closed_by, count in sorted(epoch.unproven_closes.items()):
        reasons.append(f"{count} blocks closed as {closed_by!r}, which proves no removal")
    return reasons + (gap_reasons if reasons or epoch.last_removed_at is not None else [])


def build_summary_report(
    summary: LedgerSummary, inputs: AuditInputs, policies: PolicySet, window: Window, tenant: str | None,
) -> dict[str, Any]:
    """The same report as `build_report`, from the store's incremental aggregates (no window: `since` needs
    the records)."""
    judges = _judges(policies, inputs.last_policies)
    tallies = _tallies_from_summary(summary, judges)
    names = _tenant_names(policies, tallies, tenant)
    gap_reasons = [f"unrecovered gap of {count} batches on {source}"
                   for source, count in sorted(inputs.missing_batches.items()) if count > 0]
    return {
        "generated_at": iso(window.now),
        "policy_version": policies.version,
        "since": None,
        "writes_during_read": 0,  # read in one snapshot
        "gaps": _gaps(policies, inputs),
        "unobserved": _unobserved(policies),
        "tenants": {name: _tenant_view(judges.get(name), tallies.get(name, {}), window, gap_reasons,
                                       policies.tenants.get(name))
                    for name in names},
        "judged_against_last_policy": {name: judges[name].policy_version for name in names
                                       if name in judges and not judges[name].in_force},
        "compacted_before": iso(summary.compacted_before) if summary.compacted_before is not None else None,
    }


def _tallies_from_summary(summary: LedgerSummary, judges: dict[str, Judge]) -> dict[str, dict[str, MediumTally]]:
    tallies: dict[str, dict[str, MediumTally]] = {}

    def tally(tenant: str, medium: str) -> MediumTally:
        return tallies.setdefault(tenant, {}).setdefault(medium, MediumTally())

    for row in summary.tallies:
        medium = tally(row.tenant, row.medium)
        medium.stored += row.stored
        medium.removed += row.removed
        medium.resident += row.open - row.unknown
        medium.unknown += row.unknown
        if row.epoch is not None:
            medium.epochs[row.epoch] = EpochTally(row.stored, row.removed, row.open - row.unknown, row.unknown,
                                                  Counter(), row.last_removed_at)
    for close in summary.closes:
        medium = tally(close.tenant, close.medium)
        medium.closed_by[close.closed_by] += close.count
        if close.epoch is not None and close.closed_by not in CLOSING_REASONS and close.epoch in medium.epochs:
            medium.epochs[close.epoch].unproven_closes[close.closed_by] += close.count
    for (tenant, medium_name), stats in summary.lifetimes.items():
        tally(tenant, medium_name).summarised = stats
    for (tenant, medium_name), age in summary.oldest_open_age.items():
        tally(tenant, medium_name).oldest_age = age
    for tenant, media in tallies.items():
        judge = judges.get(tenant)
        if judge is None:
            continue
        for name, medium in media.items():
            medium.medium_violations = medium.stored if name not in judge.media else 0
            outlived = medium.summarised.outlived if medium.summarised is not None else 0
            medium.age_violations = summary.overdue_open.get((tenant, name), 0) + outlived
    return tallies


def _percentile(ordered: list[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty list: a lifetime that actually occurred."""
    return round(ordered[max(0, math.ceil(fraction * len(ordered)) - 1)], 3)


def _gaps(policies: PolicySet, inputs: AuditInputs) -> list[dict[str, Any]]:
    sources = [spec.name for spec in plan_sources(policies.gateway)]
    extra = (set(inputs.missing_batches) | {event.source for event in inputs.source_events}
             | set(inputs.changes_in_progress)) - set(sources)
    return [_gap_view(source, inputs) for source in [*sources, *sorted(extra)]]


def _gap_view(source: str, inputs: AuditInputs) -> dict[str, Any]:
    events = [event for event in inputs.source_events if event.source == source]
    return {
        "source": source,
        "missing_batches": inputs.missing_batches.get(source, 0),
        "restarts": sum(event.kind == SourceEventKind.RESTART for event in events),
        "restarts_presumed": sum(event.kind == SourceEventKind.RESTART_PRESUMED for event in events),
        "lost": sum(event.kind in (SourceEventKind.SILENT, SourceEventKind.LOST) for event in events),
        "resumed": sum(event.kind == SourceEventKind.RESUMED for event in events),
        "resets": sum(event.kind == SourceEventKind.RESET for event in events),
        "closed_without_removal": sum(event.closed for event in events if event.kind in SOURCE_EVENT_KINDS),
        "last_restart_or_loss_at": iso(max(event.learned_at for event in events)) if events else None,
        "clock_offset_s": round(offset, 3) if (offset := inputs.clock_offsets.get(source)) is not None else None,
        "changes_in_progress": inputs.changes_in_progress.get(source, []),
    }


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
