"""The last stage of every request: metrics and one canonical log line."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Counter, Histogram

from gateway.log import EventLine
from gateway.metrics import ChildCache, GatewayMetrics
from gateway.outcomes import Outcome
from gateway.proxy.sse import Usage

REQUEST_LOGGER = "gateway.request"
NO_POOL = "none"
MAX_SERIES = 4096  # cached (tenant, pool, route, status) children; cleared when full, so always bounded
# A reply kept for a shadow comparison, either arm: past this the pair is given up (counted as a shadow error)
# rather than held, however long the stream runs.
SHADOW_REPLY_MAX_BYTES = 64 * 1024 * 1024


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
    overhead_s: float = 0.0  # the gateway's own time before upstream and before replying, body_wait_s left out
    body_wait_s: float = 0.0  # waiting for the client to send the rest of its body (its upload, not overhead)
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
    stack: list[str] | None = None  # frames (file:line in function) of an unforeseen failure; never its message
    content_encoding: str | None = None  # an upstream body relayed compressed, as the upstream labelled it
    dropped_fields: tuple[str, ...] = ()  # engine-steering body fields removed by policy

    def keep_for_shadow(self, chunk: bytes) -> None:
        """Add to the captured reply (called only while there is one); past SHADOW_REPLY_MAX_BYTES it is dropped,
        and the shadow pair with it."""
        assert self.capture is not None
        self.capture += chunk
        if len(self.capture) > SHADOW_REPLY_MAX_BYTES:
            self.capture = None


@dataclass(slots=True)
class RequestSeries:
    """The labelled children a tenant's (pool, route, status) writes to: looked up once, not per request
    (prometheus_client's `labels()` validates and locks on every call, ~5 µs for the six of a request). The
    TTFT and token children are created on their first observation, as `labels()` alone would: a child that
    exists is an exported series, and one that was never observed must not appear."""

    tenant: str
    pool: str
    route: str
    requests: Counter
    duration: Histogram
    ttft: Histogram | None = None
    prompt_tokens: Counter | None = None
    cached_prompt_tokens: Counter | None = None


class RequestRecorder:
    """The last stage of every request: its metrics and its log line. Holds a bounded cache of labelled children;
    children are never removed from the metrics, so a cached one is always the one `labels()` would return."""

    def __init__(self, metrics: GatewayMetrics, max_series: int = MAX_SERIES, log: EventLine | None = None) -> None:
        self.metrics = metrics
        self.log = log if log is not None else EventLine(REQUEST_LOGGER)
        self.max_series = max_series
        self._series: dict[tuple[str, str, str, int], RequestSeries] = {}
        self._overhead = ChildCache(metrics.overhead, max_series)  # by route

    def record(self, exchange: Exchange) -> None:
        if exchange.tenant:
            series = self.series(exchange.tenant, exchange.pool, exchange.route, exchange.status)
            _record_tenant_metrics(self.metrics, series, exchange)
        if exchange.pool != NO_POOL:
            self._overhead.get(exchange.route).observe(exchange.overhead_s)
        self.log.info("request", log_fields(exchange))

    def series(self, tenant: str, pool: str, route: str, status: int) -> RequestSeries:
        key = (tenant, pool, route, status)
        found = self._series.get(key)
        if found is None:
            if len(self._series) >= self.max_series:
                self._series.clear()
            found = self._series[key] = self._children(tenant, pool, route, status)
        return found

    def _children(self, tenant: str, pool: str, route: str, status: int) -> RequestSeries:
        metrics = self.metrics
        return RequestSeries(tenant, pool, route, metrics.requests.labels(tenant, pool, route, str(status)),
                             metrics.duration.labels(tenant, pool, route))


def _record_tenant_metrics(metrics: GatewayMetrics, series: RequestSeries, exchange: Exchange) -> None:
    series.requests.inc()
    series.duration.observe(exchange.duration_s)
    if exchange.ttft_s is not None:
        if series.ttft is None:
            series.ttft = metrics.ttft.labels(series.tenant, series.pool, series.route)
        series.ttft.observe(exchange.ttft_s)
    for name in exchange.dropped_fields:
        metrics.engine_fields.labels(exchange.tenant, name, "dropped").inc()
    if exchange.usage is not None:
        if series.prompt_tokens is None or series.cached_prompt_tokens is None:
            series.prompt_tokens = metrics.prompt_tokens.labels(series.tenant, series.pool)
            series.cached_prompt_tokens = metrics.cached_prompt_tokens.labels(series.tenant, series.pool)
        series.prompt_tokens.inc(exchange.usage.prompt_tokens)
        series.cached_prompt_tokens.inc(exchange.usage.cached_tokens)


def log_fields(exchange: Exchange) -> dict[str, object]:
    """The request's log line: identifiers and numbers only, never prompts, outputs, keys or salts."""
    usage = exchange.usage
    fields: dict[str, object] = {
        "request_id": exchange.request_id,
        "tenant": exchange.tenant or None,
        "route": exchange.route,
        "pool": exchange.pool,
        "upstream": exchange.upstream or None,
        "status": exchange.status,
        "outcome": exchange.outcome,
        "error": exchange.error,
        "ttft_ms": _ms(exchange.ttft_s),
        "duration_ms": _ms(exchange.duration_s),
        "overhead_ms": _ms(exchange.overhead_s),
        "prompt_tokens": usage.prompt_tokens if usage else None,
        "cached_tokens": usage.cached_tokens if usage else None,
        "policy_version": exchange.policy_version or None,
    }
    _add_optional(exchange, fields)
    return fields


def _add_optional(exchange: Exchange, fields: dict[str, object]) -> None:
    """Fields that only some requests have, left out of the others' log lines."""
    if exchange.body_wait_s:
        fields["body_wait_ms"] = _ms(exchange.body_wait_s)
    if exchange.admission is not None:
        fields["admission"] = exchange.admission
    if exchange.miss_path is not None:
        fields["miss_path"] = exchange.miss_path
    if exchange.stack is not None:
        fields["stack"] = exchange.stack
    if exchange.content_encoding is not None:
        fields["content_encoding"] = exchange.content_encoding


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)
