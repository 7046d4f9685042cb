"""The gateway's own Prometheus metrics (docs/metrics.md), on an injected registry.

Label values for `tenant` come only from the loaded policy set (plus the ledger's reserved
`unattributed`), never from request input.

Under `kvgate serve --workers N` each worker process writes its values into files in a directory shared with
its siblings (prometheus_client's multiprocess mode, switched on by PROMETHEUS_MULTIPROC_DIR in the workers'
environment); a scrape of any worker reads them all, so counters and histograms are host-wide sums. Every gauge
says how it combines across workers (`multiprocess_mode`; ignored in a single process): the ledger's gauges are
set only by the worker that ingests KV events, so a sum over live workers is that worker's value.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.multiprocess import MultiProcessCollector

MetricT = TypeVar("MetricT", bound=MetricWrapperBase)
MAX_CACHED_CHILDREN = 4096

# vLLM's own TTFT buckets, so gateway and engine histograms line up.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
                    320.0, 640.0, 1280.0)
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_DELTA_STEPS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
DELTA_BUCKETS = tuple(sorted({-step for step in _DELTA_STEPS} | {0.0} | set(_DELTA_STEPS)))
LIFETIME_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0, 604800.0)


class ChildCache(Generic[MetricT]):
    """A labelled metric's children, looked up with `labels()` once per label values instead of per request
    (`labels()` validates and locks on every call). Children are never removed from the metric, so a cached one is
    always the one `labels()` would return; the cache is cleared when full, so it stays bounded."""

    def __init__(self, metric: MetricT, max_size: int = MAX_CACHED_CHILDREN) -> None:
        self.metric = metric
        self.max_size = max_size
        self._children: dict[tuple[str, ...], MetricT] = {}

    def get(self, *labels: str) -> MetricT:
        found = self._children.get(labels)
        if found is None:
            if len(self._children) >= self.max_size:
                self._children.clear()
            found = self._children[labels] = self.metric.labels(*labels)
        return found


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, multiprocess_dir: Path | None = None) -> None:
        self.registry = registry
        self.multiprocess_dir = multiprocess_dir  # set in `--workers N` workers: scrapes read every worker's files
        self._request_metrics(registry)
        self._shadow_metrics(registry)
        self._ledger_metrics(registry)
        self._offload_metrics(registry)
        self.auth_failures = Counter(
            "kvgate_auth_failures", "Requests refused for a missing, malformed or unknown key, or a scope.",
            ["reason"], registry=registry)
        self.policy_reloads = Counter(
            "kvgate_policy_reloads", "Policy directory loads by result.", ["result"], registry=registry)
        self.user_salts_remembered = Gauge(
            "kvgate_user_salts_remembered", "Salt digests the ledger remembers for attribution (bounded LRU).",
            registry=registry, multiprocess_mode="livemax")
        self.user_salts_evicted = Counter(
            "kvgate_user_salts_evicted", "Salt digests forgotten by the bounded LRU (their blocks: unattributed).",
            registry=registry)
        self.engine_fields = Counter(
            "kvgate_engine_fields", "Body fields that steer vLLM, dropped or refused by tenant policy.",
            ["tenant", "field", "action"], registry=registry)
        self._limit_metrics(registry)
        self._worker_metrics(registry)

    def exposition(self) -> bytes:
        """The text a scrape returns: this process's registry, or with workers every worker's values combined."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        combined = CollectorRegistry()
        MultiProcessCollector(combined, path=str(self.multiprocess_dir))  # type: ignore[no-untyped-call]
        return generate_latest(combined)

    def prime(self, tenants: Iterable[str], shadow_outcomes: Iterable[str]) -> None:
        """Create every tenant's event counters at 0, so the first violation or mismatch is a visible rise."""
        shadow_outcomes = tuple(shadow_outcomes)
        for tenant in tenants:
            for kind in ("age", "medium"):
                self.retention_violations.labels(tenant, kind)
            for outcome in shadow_outcomes:
                self.shadow_requests.labels(tenant, outcome)
            self.shadow_mismatches.labels(tenant)

    def prime_admission(self, returning_tenants: Iterable[str]) -> None:
        """Admission counters at 0 for tenants whose policy says `returning` (others never decide)."""
        for tenant in returning_tenants:
            for decision in ("returning", "new", "short"):
                self.offload_admission.labels(tenant, decision)
            self.offload_admission_errors.labels(tenant)

    def _limit_metrics(self, registry: CollectorRegistry) -> None:
        self.connections_closed = Counter(
            "kvgate_connections_closed",
            "Client connections the gateway closed itself: header_too_large, header_timeout, idle_timeout, "
            "too_many_connections, malformed.", ["reason"], registry=registry)
        self.rate_limited = Counter(
            "kvgate_rate_limited", "Requests refused by a limit: max_in_flight, requests_per_minute (429) or "
            "global_in_flight (503).", ["tenant", "limit"], registry=registry)
        self.rate_limit_fallbacks = Counter(
            "kvgate_rate_limit_fallbacks", "Rate-limit decisions made locally because Redis did not answer.",
            registry=registry)
        self.client_stalls = Counter(
            "kvgate_client_stalls", "Times a streamed answer stopped reading from upstream because 1 MiB of it "
            "waited for a client that was not taking bytes; reading resumes once the client catches up.", ["tenant"],
            registry=registry)
        self.events_unread = Counter(
            "kvgate_stream_events_unread", "Upstream stream events passed on unread because they were still not "
            "complete after 8 MiB (no content, usage or usage stripping is looked for in them).", ["tenant"],
            registry=registry)
        self.internal_errors = Counter(
            "kvgate_internal_errors", "Requests that hit an unexpected gateway error (answered 500 when possible).",
            ["route"], registry=registry)

    def _worker_metrics(self, registry: CollectorRegistry) -> None:
        self.worker_restarts = Counter(
            "kvgate_worker_restarts", "Worker processes started to replace one that exited (`serve --workers`); "
            "each replacement counts itself once it has started.", registry=registry)
        self.workers_live = Gauge(
            "kvgate_workers", "Worker processes serving now (1 without `--workers`).", registry=registry,
            multiprocess_mode="livesum")
        self.workers_live.set(1)
        self.workers_configured = Gauge(
            "kvgate_workers_configured", "Worker processes asked for (`serve --workers N`; 1 for a single process).",
            registry=registry, multiprocess_mode="livemax")
        self.workers_configured.set(1)
        self.salt_announcements_failed = Counter(
            "kvgate_worker_salt_announcements_failed", "User-salt digests a worker could not pass straight to the "
            "ingesting worker (its blocks may be unattributed until the store's copy is read).", registry=registry)

    def _request_metrics(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "kvgate_requests", "Requests answered, by tenant, pool, route and HTTP status.",
            ["tenant", "pool", "route", "status"], registry=registry)
        self.ttft = Histogram(
            "kvgate_ttft_seconds", "Arrival at the gateway to the first SSE event with generated content.",
            ["tenant", "pool", "route"], buckets=TTFT_BUCKETS, registry=registry)
        self.duration = Histogram(
            "kvgate_request_duration_seconds", "Arrival at the gateway to the last byte sent.",
            ["tenant", "pool", "route"], buckets=DURATION_BUCKETS, registry=registry)
        self.overhead = Histogram(
            "kvgate_overhead_seconds", "Time the gateway itself adds before upstream and before replying (not the wait "
            "for a client's body).",
            ["route"], buckets=OVERHEAD_BUCKETS, registry=registry)
        self.prompt_tokens = Counter(
            "kvgate_prompt_tokens", "Prompt tokens reported by upstream usage.", ["tenant", "pool"],
            registry=registry)
        self.cached_prompt_tokens = Counter(
            "kvgate_cached_prompt_tokens", "Prompt tokens upstream served from cache (GPU or offload tier).",
            ["tenant", "pool"], registry=registry)

    def _shadow_metrics(self, registry: CollectorRegistry) -> None:
        self.shadow_requests = Counter(
            "kvgate_shadow_requests", "Shadow requests by outcome (compared, dropped, error).",
            ["tenant", "outcome"], registry=registry)
        self.shadow_ttft_delta = Histogram(
            "kvgate_shadow_ttft_delta_seconds", "TTFT(primary) - TTFT(shadow) per compared pair.",
            ["tenant"], buckets=DELTA_BUCKETS, registry=registry)
        self.shadow_mismatches = Counter(
            "kvgate_shadow_mismatches", "Deterministic pairs whose generated text differed.", ["tenant"],
            registry=registry)

    def _offload_metrics(self, registry: CollectorRegistry) -> None:
        self.offload_admission = Counter(
            "kvgate_offload_admission", "Offload admission decisions (returning: stored up to the cap; new, short: "
            "sent with max_offload_tokens 0).", ["tenant", "decision"], registry=registry)
        self.offload_admission_errors = Counter(
            "kvgate_offload_admission_errors", "Admission decisions taken by the local sketch because Redis did "
            "not answer.", ["tenant"], registry=registry)
        self.miss_path = Counter(
            "kvgate_miss_path", "Retries after a failure before the first byte, by pool retried, action "
            "(recompute_max_load_tokens, recompute_salt, else_pool) and result (ok, failed).",
            ["tenant", "pool", "action", "result"], registry=registry)

    def _ledger_metrics(self, registry: CollectorRegistry) -> None:
        self.blocks_stored = Counter(
            "kvgate_kv_blocks_stored", "KV blocks newly stored, by tenant and medium.", ["tenant", "medium"],
            registry=registry)
        self.blocks_removed = Counter(
            "kvgate_kv_blocks_removed", "KV blocks removed, by tenant and medium.", ["tenant", "medium"],
            registry=registry)
        self.block_lifetime = Histogram(
            "kvgate_kv_block_lifetime_seconds", "Lifetime of removed KV blocks.", ["tenant", "medium"],
            buckets=LIFETIME_BUCKETS, registry=registry)
        self.blocks_resident = Gauge(
            "kvgate_kv_blocks_resident", "KV blocks currently resident.", ["tenant", "medium"], registry=registry,
            multiprocess_mode="livesum")
        self.retention_violations = Counter(
            "kvgate_retention_violations", "Blocks found violating retention (age) or allowed media.",
            ["tenant", "kind"], registry=registry)
        self.kv_event_gaps = Counter(
            "kvgate_kv_event_gaps", "KV-event batches missed and not recovered by replay.", ["source"],
            registry=registry)
