"""The gateway as one ASGI application: lifespan builds every long-lived part; each request goes
settings/policy → auth → route → (rewrite → pool → proxy) → record.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from gateway.cli.audit import parse_since
from gateway.errors import BadRequest, Forbidden, GatewayError, NotFound, openai_error_body
from gateway.http.admin import policies_view
from gateway.http.asgi import ClientDisconnected, Receive, Scope, Send, send_body, send_error
from gateway.http.auth import AuthFailure, authenticate, authorize, check_path, presented_key
from gateway.http.routes import FORWARDED_KINDS, ROUTES, Kind, RouteSpec
from gateway.ledger.service import LedgerService
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.otel_metrics import OtelGenAIMetrics
from gateway.policy.loader import KeyGrant, PolicySet, load_policy_set
from gateway.policy.model import RESERVED_TENANT
from gateway.policy.reloader import PolicyHolder
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.forward import Proxy
from gateway.proxy.record import Exchange, record
from gateway.proxy.upstream import new_session
from gateway.settings import Settings
from gateway.shadow.client import ShadowClient
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.runner import ShadowRunner
from gateway.shadow.store import open_shadow_store
from gateway.tasks import TaskSupervisor

log = get_logger(__name__)
UNMATCHED_ROUTE = "unmatched"
JSON_HEADERS = [(b"content-type", b"application/json")]


class MethodNotAllowed(GatewayError):
    status_code = 405


@dataclass
class State:
    """Everything built in lifespan and shared by requests."""

    holder: PolicyHolder
    metrics: GatewayMetrics
    session: aiohttp.ClientSession
    proxy: Proxy
    tasks: TaskSupervisor
    shadow: ShadowRunner
    ledger: LedgerService
    ready: bool = True


class GatewayApp:
    def __init__(self, settings: Settings, registry: CollectorRegistry | None = None) -> None:
        if settings.salt_secret is None:
            raise ValueError("KVGATE_SALT_SECRET is required")
        self.settings = settings
        self.secret = settings.salt_secret.get_secret_value().encode()
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

    # -- lifespan ---------------------------------------------------------------------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()
        try:
            self._state = await self._startup()
        except Exception as error:
            log.error("startup_failed", error=str(error))
            await send({"type": "lifespan.startup.failed", "message": str(error)})
            return
        _settle_gc()
        await send({"type": "lifespan.startup.complete"})
        await receive()
        await self._shutdown(self.state)
        await send({"type": "lifespan.shutdown.complete"})

    async def _startup(self) -> State:
        policies = load_policy_set(Path(self.settings.policies))
        holder = PolicyHolder(Path(self.settings.policies), policies, self.metrics)
        self.metrics.prime(policies)
        holder.listeners.append(self.metrics.prime)
        session = new_session(self.settings.upstream_connections, self.settings.connect_timeout_s,
                              self.settings.read_timeout_s)
        tasks = TaskSupervisor("gateway")
        tasks.spawn(holder.watch(self.settings.reload_interval_s), "policy-watch")
        _on_sighup(holder.request_reload)
        ledger = await LedgerService.open(self.settings, self.metrics, holder, tasks)
        health = UpstreamHealth()
        shadow = self._shadow_runner(health, tasks)
        log.info("gateway_started", policy_version=policies.version, tenants=sorted(policies.tenants))
        proxy = Proxy(session, self.secret, health, shadow, ledger.remember_user_salt)
        return State(holder, self.metrics, session, proxy, tasks, shadow, ledger)

    def _shadow_runner(self, health: UpstreamHealth, tasks: TaskSupervisor) -> ShadowRunner:
        store = open_shadow_store(self.settings.redis_url, self.settings.state_path)
        recorder = ShadowRecorder(store, self.settings.shadow_flush_interval_s)
        tasks.spawn(recorder.run(), "shadow-recorder")
        return ShadowRunner(ShadowClient(self.settings.connect_timeout_s), self.metrics, recorder,
                            TaskSupervisor("shadow"), health, self.settings.shadow_timeout_s)

    async def _shutdown(self, state: State) -> None:
        state.ready = False
        _on_sighup(None)
        await state.ledger.close()
        await state.tasks.close()
        await state.shadow.close()
        await state.session.close()
        log.info("gateway_stopped")

    # -- requests ---------------------------------------------------------------------------------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        state = self.state
        ex = Exchange(request_id=uuid.uuid4().hex, route=UNMATCHED_ROUTE, started=time.perf_counter())
        try:
            await self._serve(state, ex, scope, receive, send)
        except GatewayError as error:
            await self._refuse(state, ex, error, send)
        except ClientDisconnected:
            ex.status, ex.outcome = 499, "client_disconnected"
        finally:
            ex.duration_s = time.perf_counter() - ex.started
            record(state.metrics, ex)
            if self.genai is not None:
                self.genai.record(ex)

    async def _refuse(self, state: State, ex: Exchange, error: GatewayError, send: Send) -> None:
        ex.status, ex.outcome = error.status_code, type(error).__name__
        if isinstance(error, AuthFailure):
            state.metrics.auth_failures.labels(error.reason).inc()
        elif isinstance(error, Forbidden):
            state.metrics.auth_failures.labels("scope").inc()
        await send_error(send, error, [(b"x-request-id", ex.request_id.encode())])

    async def _serve(self, state: State, ex: Exchange, scope: Scope, receive: Receive, send: Send) -> None:
        policies = state.holder.current
        ex.policy_version = policies.version
        raw_path = scope.get("raw_path") or scope["path"].encode()
        public = raw_path.decode("latin-1") in policies.gateway.public_paths
        grant = None if public else authenticate(presented_key(scope["headers"]), policies)
        check_path(raw_path)
        route = _route(raw_path, scope["method"])
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
        ex.status, body, headers = await self._local(state, policies, route, scope)
        await send_body(send, ex.status, body, [*headers, (b"x-request-id", ex.request_id.encode())])

    async def _local(
        self, state: State, policies: PolicySet, route: RouteSpec, scope: Scope
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        if route.kind is Kind.METRICS:
            return 200, generate_latest(state.metrics.registry), [(b"content-type", CONTENT_TYPE_LATEST.encode())]
        if route.kind is Kind.HEALTH:
            return _health(route, state)
        return _json(*await self._admin(state, policies, route, scope))

    async def _admin(self, state: State, policies: PolicySet, route: RouteSpec, scope: Scope) -> tuple[int, Any]:
        if route.path == "/admin/policies":
            return 200, policies_view(policies)
        if route.path == "/admin/shadow":
            return 200, await state.shadow.report(policies, _recent_pairs(scope))
        if route.path == "/admin/audit":
            tenant, since = _audit_query(scope, policies)
            return 200, await state.ledger.audit(policies, tenant, since)
        if route.path == "/admin/reload":
            changed = state.holder.reload()
            return 200, {"reloaded": changed, "policy_version": state.holder.current.version}
        message = f"{route.path} is not available in this build."
        return 501, openai_error_body(message, "not_implemented", None, "not_implemented")


def _recent_pairs(scope: Scope) -> int:
    value = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("pairs", ["0"])[0]
    if not value.isdigit():
        raise BadRequest("pairs must be a non-negative integer.", param="pairs")
    return min(int(value), 5000)


def _audit_query(scope: Scope, policies: PolicySet) -> tuple[str | None, datetime | None]:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    tenant = query.get("tenant", [None])[0]
    if tenant is not None and tenant not in policies.tenants and tenant != RESERVED_TENANT:
        raise NotFound(f"No tenant {tenant!r}.", param="tenant")
    since = query.get("since", [None])[0]
    try:
        return tenant, parse_since(since) if since else None
    except ValueError:
        raise BadRequest("since must be an ISO 8601 time, e.g. 2026-11-29T12:00:00Z.", param="since") from None


def _route(raw_path: bytes, method: str) -> RouteSpec:
    route = ROUTES.get(raw_path.decode("latin-1"))
    if route is None:
        raise NotFound("No such route.")
    if method not in route.methods:
        raise MethodNotAllowed(f"{method} is not allowed on {route.path}.")
    return route


def _health(route: RouteSpec, state: State) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    ok = route.path == "/livez" or state.ready
    return _json(200 if ok else 503, {"status": "ok" if ok else "not ready"})


def _json(status: int, body: Any) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    return status, msgspec.json.encode(body), JSON_HEADERS


def _on_sighup(callback: Any) -> None:
    loop = asyncio.get_running_loop()
    if callback is None:
        loop.remove_signal_handler(signal.SIGHUP)
    else:
        loop.add_signal_handler(signal.SIGHUP, callback)


# Start-up leaves ~70k long-lived objects (modules, policies, metrics) that the cyclic collector would re-scan on
# every older-generation pass; with hundreds of streams in flight, collection took 6-16 % of the gateway's CPU
# (loadtests/proxy_overhead.py). Freezing them and collecting the young generation less often roughly halves
# that, with unchanged memory in that benchmark. Collection still runs; only its timing changes.
GC_THRESHOLDS = (10_000, 20, 20)


def _settle_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
