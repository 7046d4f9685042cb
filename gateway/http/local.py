"""Endpoints the gateway answers itself: metrics, health and the admin API. Each is named on its route
(`RouteSpec.local`); nothing here compares path strings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.asgi.io import Scope
from gateway.errors import BadRequest, NotFound
from gateway.http.admin import policies_view
from gateway.http.wiring import State
from gateway.isotime import parse_since
from gateway.plan.admin import plan_view
from gateway.policy.loader import PolicySet
from gateway.policy.model import RESERVED_TENANT
from gateway.routes import Local, RouteSpec

JSON_HEADERS = [(b"content-type", b"application/json")]
MAX_RECENT_PAIRS = 5000
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
AdminHandler = Callable[[State, PolicySet, Scope], Awaitable[tuple[int, Any]]]


async def answer_locally(state: State, policies: PolicySet, route: RouteSpec, scope: Scope) -> Answer:
    local = route.local
    if local is Local.METRICS:
        return 200, generate_latest(state.metrics.registry), [(b"content-type", CONTENT_TYPE_LATEST.encode())]
    if local is Local.LIVEZ or local is Local.READYZ:
        ok = local is Local.LIVEZ or state.ready
        return json_answer(200 if ok else 503, {"status": "ok" if ok else "not ready"})
    handler = ADMIN_HANDLERS.get(local) if local is not None else None
    if handler is None:
        raise NotFound("No such route.")
    return json_answer(*await handler(state, policies, scope))


def json_answer(status: int, body: Any) -> Answer:
    return status, msgspec.json.encode(body), JSON_HEADERS


async def _policies(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    return 200, policies_view(policies)


async def _shadow(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    return 200, await state.shadow.report(policies, _recent_pairs(scope))


async def _audit(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    tenant, since = _audit_query(scope, policies)
    report = await state.ledger.audit(policies, tenant, since)
    return 200, {**report, "isolation_canary": state.canary.summary(policies)}


async def _canary(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    outcomes = [outcome for pool in _canary_pools(scope, policies)
                for outcome in await state.canary.run_pool(policies, pool)]
    return 200, {"outcomes": [outcome.view() for outcome in outcomes]}


async def _plan(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    return 200, await plan_view(state.reuse, policies, state.session, scope.get("query_string", b""))


async def _reload(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    changed = await state.holder.reload_async()
    return 200, {"reloaded": changed, "policy_version": state.holder.current.version}


ADMIN_HANDLERS: dict[Local, AdminHandler] = {
    Local.POLICIES: _policies,
    Local.SHADOW: _shadow,
    Local.AUDIT: _audit,
    Local.RELOAD: _reload,
    Local.CANARY: _canary,
    Local.PLAN: _plan,
}


def _canary_pools(scope: Scope, policies: PolicySet) -> list[str]:
    pool = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("pool", [None])[0]
    if pool is None:
        return sorted(policies.gateway.pools)
    if pool not in policies.gateway.pools:
        raise NotFound(f"No pool {pool!r}.", param="pool")
    return [pool]


def _recent_pairs(scope: Scope) -> int:
    value = parse_qs(scope.get("query_string", b"").decode("latin-1")).get("pairs", ["0"])[0]
    if not value.isdigit():
        raise BadRequest("pairs must be a non-negative integer.", param="pairs")
    return min(int(value), MAX_RECENT_PAIRS)


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
