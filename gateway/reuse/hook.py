"""The reuse trace's end-of-request hook: one call per forwarded request, after the reply was sent."""

from __future__ import annotations

from gateway.log import get_logger
from gateway.policy.model import TenantPolicy
from gateway.record import Exchange
from gateway.reuse.trace import ReuseTrace
from gateway.rewrite import RewrittenRequest
from gateway.routes import Kind, RouteSpec

log = get_logger(__name__)


class ReuseTraceHook:
    """Passes successful generation requests to the trace; everything else is not a cache lookup to learn from."""

    def __init__(self, trace: ReuseTrace) -> None:
        self.trace = trace

    def __call__(self, ex: Exchange, tenant: TenantPolicy, route: RouteSpec, prepared: RewrittenRequest | None) -> None:
        if prepared is None or route.kind is not Kind.GENERATE or ex.status != 200 or ex.outcome != "ok":
            return
        try:
            user = prepared.user if tenant.cache.isolation == "user" else None
            self.trace.observe(tenant.tenant, tenant.cache.salt_epoch, ex.pool, prepared.parsed, ex.usage, user)
        except Exception as error:  # the reply is already sent: a trace bug must not touch the request's outcome
            self.trace.metrics.requests.labels(tenant.tenant, "error").inc()
            log.warning("reuse_trace_failed", request_id=ex.request_id, error=type(error).__name__)
