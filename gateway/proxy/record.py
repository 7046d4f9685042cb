"""The last stage of every request: metrics and one canonical log line."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.outcomes import Outcome
from gateway.proxy.sse import Usage

log = get_logger("gateway.request")
NO_POOL = "none"


@dataclass
class Exchange:
    """What happened to one request, filled in as it moves through the gateway."""

    request_id: str
    route: str
    started: float
    tenant: str = ""
    pool: str = NO_POOL
    upstream: str = ""
    status: int = 0
    overhead_s: float = 0.0
    ttft_s: float | None = None
    duration_s: float = 0.0
    usage: Usage | None = None
    outcome: Outcome = Outcome.OK
    error: str | None = None  # the error class of a request the gateway refused
    policy_version: str = ""
    sent_at: float = 0.0  # when the upstream request left (perf_counter)
    model: str | None = None  # `model` of the rewritten request body (GenAI metrics)
    capture: bytearray | None = None  # the primary's reply bytes, kept only for shadowed requests
    admission: str | None = None  # the offload admission decision (returning, new, short), when the tenant has one
    miss_path: list[dict[str, str]] | None = None  # the first failure and each retry, when the miss path ran
    dropped_fields: tuple[str, ...] = ()  # engine-steering body fields removed by policy


def record(metrics: GatewayMetrics, exchange: Exchange) -> None:
    if exchange.tenant:
        _record_tenant_metrics(metrics, exchange)
    if exchange.pool != NO_POOL:
        metrics.overhead.labels(exchange.route).observe(exchange.overhead_s)
    _log_line(exchange)


def _record_tenant_metrics(metrics: GatewayMetrics, exchange: Exchange) -> None:
    tenant, pool, route = exchange.tenant, exchange.pool, exchange.route
    metrics.requests.labels(tenant, pool, route, str(exchange.status)).inc()
    metrics.duration.labels(tenant, pool, route).observe(exchange.duration_s)
    if exchange.ttft_s is not None:
        metrics.ttft.labels(tenant, pool, route).observe(exchange.ttft_s)
    for name in exchange.dropped_fields:
        metrics.engine_fields.labels(tenant, name, "dropped").inc()
    if exchange.usage is not None:
        metrics.prompt_tokens.labels(tenant, pool).inc(exchange.usage.prompt_tokens)
        metrics.cached_prompt_tokens.labels(tenant, pool).inc(exchange.usage.cached_tokens)


def _log_line(exchange: Exchange) -> None:
    usage = exchange.usage
    log.info(
        "request",
        request_id=exchange.request_id,
        tenant=exchange.tenant or None,
        route=exchange.route,
        pool=exchange.pool,
        upstream=exchange.upstream or None,
        status=exchange.status,
        outcome=exchange.outcome,
        error=exchange.error,
        ttft_ms=_ms(exchange.ttft_s),
        duration_ms=_ms(exchange.duration_s),
        overhead_ms=_ms(exchange.overhead_s),
        prompt_tokens=usage.prompt_tokens if usage else None,
        cached_tokens=usage.cached_tokens if usage else None,
        policy_version=exchange.policy_version or None,
        **_optional(exchange),
    )


def _optional(exchange: Exchange) -> dict[str, object]:
    """Fields that only some requests have, left out of the others' log lines."""
    fields: dict[str, object] = {}
    if exchange.admission is not None:
        fields["admission"] = exchange.admission
    if exchange.miss_path is not None:
        fields["miss_path"] = exchange.miss_path
    return fields


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
