"""Resident memory of an LMCache multi-process server, read from its /metrics page, for `kvgate plan`. Pure.

LMCache 0.5.6's server exposes /metrics through its OpenTelemetry Prometheus exporter, which starts
prometheus_client's own HTTP server on `--prometheus-port` (default 9090; `lmcache/v1/mp_observability/
otel_init.py`); that server serves the default registry, which on Linux includes the standard process
collector, so `process_resident_memory_bytes` is the whole process's RSS: tiers, pinned buffers, interpreter
and clients together — the figure a memory budget needs. (LMCache's in-process internal API server's /metrics,
`lmcache/v1/internal_api_server/common/metrics_api.py`, serves the same default registry.)
Under prometheus multiprocess mode that collector is absent; then the CPU tier's own gauge
`lmcache:local_cache_usage` (bytes) is used and marked as a lower bound, never as the process size.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.connectors.metrics_text import sum_samples

RSS_METRIC = "process_resident_memory_bytes"
TIER_METRIC = "lmcache:local_cache_usage"


@dataclass(frozen=True)
class CacheServerMemory:
    bytes: int
    metric: str
    lower_bound: bool  # True: only the CPU tier's bytes were reported, the process holds more


def cache_server_memory(metrics_text: str) -> CacheServerMemory | None:
    """The server's resident bytes, or None when the page has neither metric."""
    rss = sum_samples(metrics_text, (RSS_METRIC,))
    if rss is not None:
        return CacheServerMemory(int(rss), RSS_METRIC, lower_bound=False)
    tier = sum_samples(metrics_text, (TIER_METRIC,))
    if tier is not None:
        return CacheServerMemory(int(tier), TIER_METRIC, lower_bound=True)
    return None
