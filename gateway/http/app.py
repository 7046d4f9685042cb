"""The gateway as one ASGI application: each request goes auth → route → (proxy | local endpoint) → record.

Start-up and shutdown composition lives in gateway.http.wiring; the endpoints the gateway answers itself in
gateway.http.local; the request path for forwarded routes in gateway.proxy.forward.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path

from prometheus_client import CollectorRegistry

from gateway.asgi.io import ClientDisconnected, Message, Receive, Scope, Send, send_body, send_error
from gateway.errors import Forbidden, GatewayError, InternalError, MethodNotAllowed, NotFound
from gateway.http.auth import AuthFailure, authenticate, authorize, check_path, presented_key
from gateway.http.local import answer_locally
from gateway.http.process import keep_freed_memory, on_sighup, settle_gc
from gateway.http.request_ids import RequestIds
from gateway.http.wiring import State, start, stop
from gateway.http.workers import WorkerRole
from gateway.log import EventLine, get_logger, stack_frames
from gateway.metrics import GatewayMetrics
from gateway.outcomes import Outcome
from gateway.policy.loader import PolicySet
from gateway.policy.reloader import PolicyHolder
from gateway.proxy.features import Admitted, Inbound, Readmit
from gateway.proxy.otel_metrics import OtelGenAIMetrics
from gateway.proxy.record import REQUEST_LOGGER, Exchange, RequestRecorder
from gateway.routes import FORWARDED_KINDS, ROUTES, RouteSpec
from gateway.settings import Settings, salt_secret_bytes
from gateway.strict.request_fields import FieldRefused

log = get_logger(__name__)
UNMATCHED_ROUTE = "unmatched"
UNCAPPED_PATHS = frozenset({"/livez", "/readyz", "/metrics"})  # probes and scrapes answer even under overload


class GatewayApp:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None,
                 role: WorkerRole | None = None, metrics_dir: Path | None = None) -> None:
        """`role` and `metrics_dir` are given to each worker of `serve --workers N` (gateway/cli/workers.py)."""
        self.settings = settings
        self.secret = salt_secret_bytes(settings)
        self.role = role
        self.metrics = GatewayMetrics(registry or CollectorRegistry(), metrics_dir)
        self.genai = OtelGenAIMetrics(self.metrics.registry) if settings.otel_metrics else None
        # After configure_logging (gateway/cli/serve.py): the request line is written where structlog writes.
        request_line = EventLine(REQUEST_LOGGER, settings.log_format, settings.log_level)
        self.recorder = RequestRecorder(self.metrics, log=request_line)
        self.request_ids = RequestIds()
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
            self._state = await start(self.settings, self.secret, self.metrics, self.genai, self.role)
        except Exception as error:
            log.error("startup_failed", error=str(error))
            await send({"type": "lifespan.startup.failed", "message": str(error)})
            return
        on_sighup(self.state.holder.request_reload)
        settle_gc()
        keep_freed_memory()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        on_sighup(None)
        await stop(self.state)
        await send({"type": "lifespan.shutdown.complete"})

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        ex = Exchange(request_id=self.request_ids.next(), route=UNMATCHED_ROUTE, started=time.perf_counter())
        tracked = ResponseTracker(send)
        try:
            capped = scope["path"] not in UNCAPPED_PATHS
            async with state.limits.global_slot() if capped else nullcontext():
                await self._serve(state, ex, scope, receive, tracked)
        except GatewayError as error:
            await self._refuse(state, ex, error, tracked)
        except ClientDisconnected:
            ex.status, ex.outcome = 499, Outcome.CLIENT_DISCONNECTED
        except Exception as error:  # the last resort: never let uvicorn answer (plain text, status 0 in our log)
            await self._internal_error(state, ex, error, tracked)
        finally:
            ex.duration_s = time.perf_counter() - ex.started
            self.recorder.record(ex)
            state.features.finished(ex)

    async def _refuse(self, state: State, ex: Exchange, error: GatewayError, tracked: ResponseTracker) -> None:
        if isinstance(error, AuthFailure):
            state.metrics.auth_failures.labels(error.reason).inc()
        elif isinstance(error, Forbidden):
            state.metrics.auth_failures.labels("scope").inc()
        elif isinstance(error, FieldRefused) and ex.tenant:
            state.metrics.engine_fields.labels(ex.tenant, error.field, "refused").inc()
        ex.outcome, ex.error = Outcome.REFUSED, type(error).__name__
        if tracked.started:  # a refusal raised after the response began cannot change its status
            return
        ex.status = error.status_code
        await send_error(tracked.send, error, [*error.headers(), (b"x-request-id", ex.request_id.encode())])

    async def _internal_error(self, state: State, ex: Exchange, error: Exception, tracked: ResponseTracker) -> None:
        state.metrics.internal_errors.labels(ex.route).inc()
        ex.outcome, ex.error = Outcome.INTERNAL_ERROR, type(error).__name__
        ex.stack = stack_frames(error.__traceback__)
        if tracked.started:
            ex.status = ex.status or 500
            return  # the status line is gone; the connection ends when this task does
        ex.status = 500
        refusal = InternalError("The gateway failed to handle this request.", code="internal_error")
        try:
            await send_error(tracked.send, refusal, [(b"x-request-id", ex.request_id.encode())])
        except Exception:  # the client is gone; the log line still says what happened
            ex.status = 499

    async def _serve(
        self, state: State, ex: Exchange, scope: Scope, receive: Receive, tracked: ResponseTracker
    ) -> None:
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
        inbound = Inbound(scope, receive, tracked.send, tracked.server_send)
        if route.kind in FORWARDED_KINDS and grant is not None:
            readmit = readmission(state.holder, scope["headers"], ex)
            await self._forward(state, ex, Admitted(policies, policies.tenants[grant.tenant], route, readmit), inbound)
        else:
            await self._answer_locally(state, ex, policies, route, inbound)

    async def _forward(self, state: State, ex: Exchange, admitted: Admitted, inbound: Inbound) -> None:
        async with state.limits.tenant_slot(admitted.tenant):
            await state.proxy.forward(ex, admitted, inbound)

    async def _answer_locally(
        self, state: State, ex: Exchange, policies: PolicySet, route: RouteSpec, inbound: Inbound
    ) -> None:
        ex.status, body, headers = await answer_locally(state, policies, route, inbound.scope)
        if state.role is not None:  # which worker answered: for operators and the multi-worker tests
            headers = [*headers, state.role.header]
        await send_body(inbound.send, ex.status, body, [*headers, (b"x-request-id", ex.request_id.encode())])


def readmission(holder: PolicyHolder, headers: Iterable[tuple[bytes, bytes]], ex: Exchange) -> Readmit:
    """Admits a request again if another policy set came into force since it was admitted."""

    def readmit(admitted: Admitted) -> Admitted:
        policies = holder.current
        if policies is admitted.policies:
            return admitted
        grant = authenticate(presented_key(headers), policies)
        authorize(grant, admitted.route)
        ex.policy_version, ex.tenant = policies.version, grant.tenant
        return Admitted(policies, policies.tenants[grant.tenant], admitted.route, readmit)

    return readmit


class ResponseTracker:
    """Wraps `send` to remember whether the response has started (after that, no error status can be sent)."""

    def __init__(self, send: Send) -> None:
        self.server_send = send  # the server's own; also for body messages after the start (Inbound.server_send)
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.server_send(message)


def find_route(raw_path: bytes, method: str) -> RouteSpec:
    route = ROUTES.get(raw_path.decode("latin-1"))
    if route is None:
        raise NotFound("No such route.")
    if method not in route.methods:
        raise MethodNotAllowed(f"{method} is not allowed on {route.path}.")
    return route
