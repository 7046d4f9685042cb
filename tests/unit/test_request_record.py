"""The request recorder's cached metric children: every request is counted in the series `labels()` names, the
cache stays within its bound, and a cleared cache counts on in the same series."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.metrics import GatewayMetrics
from gateway.proxy.record import NO_POOL, Exchange, RequestRecorder
from gateway.proxy.sse import Usage


def exchange(tenant: str, status: int = 200, pool: str = "main") -> Exchange:
    return Exchange("req", "chat", 0.0, tenant=tenant, pool=pool, status=status, overhead_s=0.001, ttft_s=0.02,
                    duration_s=0.1, usage=Usage(prompt_tokens=10, cached_tokens=4, completion_tokens=3))


def requests(registry: CollectorRegistry, tenant: str, status: str = "200", pool: str = "main") -> float | None:
    return registry.get_sample_value("kvgate_requests_total",
                                     {"tenant": tenant, "pool": pool, "route": "chat", "status": status})


def test_cached_children_count_every_request_in_their_series() -> None:
    registry = CollectorRegistry()
    recorder = RequestRecorder(GatewayMetrics(registry))
    for _ in range(3):
        recorder.record(exchange("acme"))
    recorder.record(exchange("acme", status=429))
    assert (requests(registry, "acme"), requests(registry, "acme", "429")) == (3.0, 1.0)
    labels = {"tenant": "acme", "pool": "main"}
    assert registry.get_sample_value("kvgate_prompt_tokens_total", labels) == 40.0
    assert registry.get_sample_value("kvgate_cached_prompt_tokens_total", labels) == 16.0
    assert registry.get_sample_value("kvgate_request_duration_seconds_count",
                                     {**labels, "route": "chat"}) == 4.0
    assert registry.get_sample_value("kvgate_overhead_seconds_count", {"route": "chat"}) == 4.0


def test_the_cache_is_bounded_and_counting_goes_on_after_it_is_cleared() -> None:
    registry = CollectorRegistry()
    recorder = RequestRecorder(GatewayMetrics(registry), max_series=2)
    for round_ in range(2):
        for tenant in ("a", "b", "c"):
            recorder.record(exchange(tenant))
            assert len(recorder._series) <= 2, round_
    assert [requests(registry, tenant) for tenant in ("a", "b", "c")] == [2.0, 2.0, 2.0]


def test_a_request_without_a_tenant_writes_no_tenant_series() -> None:
    registry = CollectorRegistry()
    recorder = RequestRecorder(GatewayMetrics(registry))
    recorder.record(exchange("", status=401, pool=NO_POOL))
    assert requests(registry, "", "401", NO_POOL) is None
    assert registry.get_sample_value("kvgate_overhead_seconds_count", {"route": "chat"}) is None


def test_series_never_observed_are_not_exported() -> None:
    """A tenant whose requests carry no TTFT and no usage (a metrics scrape, a refused request) gets a request
    count and a duration, and no TTFT or token series: a child that exists is exported, even at zero."""
    registry = CollectorRegistry()
    recorder = RequestRecorder(GatewayMetrics(registry))
    plain = Exchange("req", "chat", 0.0, tenant="ops", pool="main", status=200, overhead_s=0.001, duration_s=0.1)
    recorder.record(plain)
    recorder.record(plain)
    assert requests(registry, "ops") == 2.0
    labels = {"tenant": "ops", "pool": "main"}
    assert registry.get_sample_value("kvgate_ttft_seconds_count", {**labels, "route": "chat"}) is None
    assert registry.get_sample_value("kvgate_prompt_tokens_total", labels) is None
    assert registry.get_sample_value("kvgate_cached_prompt_tokens_total", labels) is None
    recorder.record(exchange("ops"))  # the first observation creates them, in the same series labels() names
    assert registry.get_sample_value("kvgate_ttft_seconds_count", {**labels, "route": "chat"}) == 1.0
    assert registry.get_sample_value("kvgate_prompt_tokens_total", labels) == 10.0
