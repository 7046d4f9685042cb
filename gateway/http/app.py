"""The gateway as one ASGI application: each request goes auth → route → (proxy | local endpoint) → record.

Start-up and shutdown composition lives in gateway.http.wiring; the endpoints the gateway answers itself in
gateway.http.local; the request path for forwarded routes in gateway.proxy.forward.
"""

from __future__ import annotations

import time
import uuid

from prometheus_client import CollectorRegistry

from gateway.asgi.io import ClientDisconnected, Receive, Scope, Send, send_body, send_error
from gateway.errors import Forbidden, GatewayError, MethodNotAllowed, NotFound
from gateway.http.auth import AuthFailure, authenticate, authorize, check_path, presented_key
from gateway.http.local import answer_locally
from gateway.http.process import on_sighup, settle_gc
from gateway.http.wiring import State, start, stop
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.outcomes import Outcome
from gateway.policy.loader import KeyGrant, PolicySet
from gateway.proxy.otel_metrics import OtelGenAIMetrics
from gateway.proxy.record import Exchange, record
from gateway.routes import FORWARDED_KINDS, ROUTES, RouteSpec
from gateway.settings import Settings, salt_secret_bytes
from gateway.strict.request_fields import FieldRefused

log = get_logger(__name__)
UNMATCHED_ROUTE = "unmatched"


class GatewayApp:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        self.settings = settings
        self.secret = salt_secret_bytes(settings)
        self.metrics = GatewayMetrics(registry or CollectorRegistry())
        self.genai = OtelGenAIMetrics(self.metrics.registry) if settings.otel_metrics else None
        self._state: State | None = None

    @property
    def state(self) -> State:
        if self._state is None:
            raise RuntimeError("the gateway has not started")
        return self._state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await send({"type": "websocket.close", "code": 1008})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()
        try:
            self._state = await start(self.settings, self.secret, self.metrics, self.genai)
        except Exception as error:
            log.error("startup_failed", error=str(error))
            await send({"type": "lifespan.startup.failed", "message": str(error)})
            return
        on_sighup(self.state.holder.request_reload)
        settle_gc()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        on_sighup(None)
        await stop(self.state)
        await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        ex = Exchange(request_id=uuid.uuid4().hex, route=UNMATCHED_ROUTE, started=time.perf_counter())
        try:
            await self._serve(state, ex, scope, receive, send)
        except GatewayError as error:
            await self._refuse(state, ex, error, send)
        except ClientDisconnected:
            ex.status, ex.outcome = 499, Outcome.CLIENT_DISCONNECTED
        finally:
            ex.duration_s = time.perf_counter() - ex.started
            record(state.metrics, ex)
            state.features.finished(ex)

    async def _refuse(self, state: State, ex: Exchange, error: GatewayError, send: Send) -> None:
        ex.status, ex.outcome, ex.error = error.status_code, Outcome.REFUSED, type(error).__name__
        if isinstance(error, AuthFailure):
            state.metrics.auth_failures.labels(error.reason).inc()
        elif isinstance(error, Forbidden):
            state.metrics.auth_failures.labels("scope").inc()
        elif isinstance(error, FieldRefused) and ex.tenant:
            state.metrics.engine_fields.labels(ex.tenant, error.field, "refused").inc()
        await send_error(send, error, [(b"x-request-id", ex.request_id.encode())])

    async def _serve(self, state: State, ex: Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        policies = state.holder.current
        ex.policy_version = policies.version
        raw_path = scope.get("raw_path") or scope["path"].encode()
        public = raw_path.decode("latin-1") in policies.gateway.public_paths
        grant = None if public else authenticate(presented_key(scope["headers"]), policies)
        check_path(raw_path)
        route = find_route(raw_path, scope["method"])
        ex.route = route.path
        if grant is not None:
            authorize(grant, route)
            ex.tenant = grant.tenant
        await self._dispatch(state, policies, grant, route, ex, scope, receive, send)

    async def _dispatch(
        self, state: State, policies: PolicySet, grant: KeyGrant | None, route: RouteSpec, ex: Exchange,
        scope: Scope, receive: Receive, send: Send,
    ) -> None:
        if route.kind in FORWARDED_KINDS and grant is not None:
            tenant = policies.tenants[grant.tenant]
            await state.proxy.forward(ex, policies, tenant, route, scope, receive, send)
            return
        ex.status, body, headers = await answer_locally(state, policies, route, scope)
        await send_body(send, ex.status, body, [*headers, (b"x-request-id", ex.request_id.encode())])


def find_route(raw_path: bytes, method: str) -> RouteSpec:
    route = ROUTES.get(raw_path.decode("latin-1"))
    if route is None:
        raise NotFound("No such route.")
    if method not in route.methods:
        raise MethodNotAllowed(f"{method} is not allowed on {route.path}.")
    return route
