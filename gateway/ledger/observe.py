"""The ledger's Prometheus metrics (docs/metrics.md), fed only by batches this process wrote to the store,
so replicas sharing one stream add up to one count. Tenant labels are configured tenants or
`unattributed`; records of tenants no longer configured are left out of metrics (the audit still shows them).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from prometheus_client import Counter as PromCounter

from gateway.kvevents.media import BlockMedium
from gateway.ledger.records import BatchOps, OpenOp
from gateway.ledger.salts import DigestLru
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.model import RESERVED_TENANT


class LedgerMetrics:
    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics
        self._resident_labels: set[tuple[str, str]] = set()
        self._evicted_seen = 0
        registry = metrics.registry
        self.store_errors = PromCounter(
            "kvgate_ledger_store_errors", "Ledger store writes or reads that failed (kept and retried), by kind: "
            "`unavailable` or the error class.", ["kind"], registry=registry)
        self.task_restarts = PromCounter(
            "kvgate_ledger_task_restarts", "Ledger tasks (writer, subscribers, loops) that ended and were restarted.",
            ["task"], registry=registry)
        self.spool_dropped_events = PromCounter(
            "kvgate_ledger_spool_dropped_events", "Block events dropped because the spool was full (their batch is "
            "recorded as a gap).", registry=registry)

    def user_salts(self, remembered: DigestLru) -> None:
        self.metrics.user_salts_remembered.set(len(remembered))
        evicted = remembered.evicted - self._evicted_seen
        if evicted > 0:
            self.metrics.user_salts_evicted.inc(evicted)
            self._evicted_seen = remembered.evicted

    def store_error(self, kind: str) -> None:
        self.store_errors.labels(kind).inc()

    def task_restarted(self, task: str) -> None:
        self.task_restarts.labels(task).inc()

    def spool_dropped(self, events: int) -> None:
        self.spool_dropped_events.inc(events)

    def applied(self, batch: BatchOps, policies: PolicySet) -> None:
        stored = Counter((op.tenant, op.medium) for op in batch.ops if isinstance(op, OpenOp))
        for (tenant, medium), count in stored.items():
            if _labelled(tenant, policies):
                self.metrics.blocks_stored.labels(tenant, medium).inc(count)
                self._medium_violations(tenant, medium, count, policies)
        for closed in batch.closed:
            if _labelled(closed.tenant, policies):
                self.metrics.blocks_removed.labels(closed.tenant, closed.medium).inc()
                self.metrics.block_lifetime.labels(closed.tenant, closed.medium).observe(closed.lifetime_s)
                self._age_violation(closed.tenant, closed.lifetime_s, closed.flagged, policies)

    def _medium_violations(self, tenant: str, medium: BlockMedium, count: int, policies: PolicySet) -> None:
        policy = policies.tenants.get(tenant)
        if policy is not None and medium not in policy.offload.allowed_media:
            self.metrics.retention_violations.labels(tenant, "medium").inc(count)

    def _age_violation(self, tenant: str, lifetime_s: float, flagged: bool, policies: PolicySet) -> None:
        policy = policies.tenants.get(tenant)
        limit = policy.offload.retention_seconds if policy is not None else None
        if limit is not None and lifetime_s > limit and not flagged:
            self.metrics.retention_violations.labels(tenant, "age").inc()

    def overdue(self, tenants: Counter[str], policies: PolicySet) -> None:
        """Resident blocks found past their retention by the sweep (each block counted once)."""
        for tenant, count in tenants.items():
            if _labelled(tenant, policies):
                self.metrics.retention_violations.labels(tenant, "age").inc(count)

    def resident(self, counts: Mapping[tuple[str, str], int], policies: PolicySet) -> None:
        labels = {key for key, count in counts.items() if count > 0 and _labelled(key[0], policies)}
        for tenant, medium in labels | self._resident_labels:
            self.metrics.blocks_resident.labels(tenant, medium).set(counts.get((tenant, medium), 0))
        self._resident_labels |= labels

    def missing(self, source: str, batches: int) -> None:
        self.metrics.kv_event_gaps.labels(source).inc(batches)


def _labelled(tenant: str, policies: PolicySet) -> bool:
    return tenant == RESERVED_TENANT or tenant in policies.tenants
