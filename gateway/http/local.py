"""Endpoints the gateway answers itself: metrics, health and the admin API. Each is named on its route
(`RouteSpec.local`); nothing here compares path strings."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any
from urllib.parse import parse_qs

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST

from gateway.asgi.io import Scope
from gateway.errors import BadRequest, NotFound
from gateway.http.admin import policies_view
from gateway.http.wiring import State
from gateway.http.workers import INGESTER_ROUTES
from gateway.isotime import parse_since
from gateway.policy.loader import PolicySet
from gateway.policy.model import RESERVED_TENANT
from gateway.routes import Local, RouteSpec

JSON_HEADERS = [(b"content-type", b"application/json")]
MAX_RECENT_PAIRS = 5000
PAIRS = re.compile(r"[0-9]{1,6}")
MAX_QUERY_FIELDS = 8
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]
AdminHandler = Callable[[State, PolicySet, Scope], Awaitable[tuple[int, Any]]]


async def answer_locally(state: State, policies: PolicySet, route: RouteSpec, scope: Scope) -> Answer:
    local = route.local
    if local is Local.METRICS:
        return 200, state.metrics.exposition(), [(b"content-type", CONTENT_TYPE_LATEST.encode())]
    if state.ingester is not None and local in INGESTER_ROUTES:
        return await state.ingester.forward(scope)
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
    admin_query(scope, frozenset())
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
    from gateway.plan.admin import plan_view  # the planner's modules load with the first plan asked for

    return 200, await plan_view(state.reuse, policies, state.calls, scope.get("query_string", b""))


async def _reload(state: State, policies: PolicySet, scope: Scope) -> tuple[int, Any]:
    admin_query(scope, frozenset())
    changed = await state.holder.reload_async()
    if state.role is not None:
        state.role.reload_everywhere()  # this worker has reloaded; the parent signals its siblings
    return 200, {"reloaded": changed, "policy_version": state.holder.current.version}


ADMIN_HANDLERS: dict[Local, AdminHandler] = {
    Local.POLICIES: _policies,
    Local.SHADOW: _shadow,
    Local.AUDIT: _audit,
    Local.RELOAD: _reload,
    Local.CANARY: _canary,
    Local.PLAN: _plan,
}


def admin_query(scope: Scope, allowed: frozenset[str]) -> dict[str, str]:
    """An admin route's query parameters: only its own names, each at most once, printable ASCII (else 400)."""
    raw: bytes = scope.get("query_string", b"")
    try:
        text = raw.decode("ascii")
        pairs = parse_qs(text, keep_blank_values=True, strict_parsing=bool(text), errors="strict",
                         max_num_fields=MAX_QUERY_FIELDS)
    except (UnicodeDecodeError, ValueError):
        raise BadRequest("The query string is not valid.") from None
    for name, values in pairs.items():
        if name not in allowed:
            raise BadRequest(f"Unknown query parameter {name!r}.", param=name)
        if len(values) > 1:
            raise BadRequest(f"Query parameter {name!r} is given more than once.", param=name)
        if not values[0].isprintable():
            raise BadRequest(f"Query parameter {name!r} holds control characters.", param=name)
    return {name: values[0] for name, values in pairs.items()}


def _canary_pools(scope: Scope, policies: PolicySet) -> list[str]:
    pool = admin_query(scope, frozenset({"pool"})).get("pool")
    if pool is None:
        return sorted(policies.gateway.pools)
    if pool not in policies.gateway.pools:
        raise NotFound(f"No pool {pool!r}.", param="pool")
    return [pool]


def _recent_pairs(scope: Scope) -> int:
    value = admin_query(scope, frozenset({"pairs"})).get("pairs", "0")
    if PAIRS.fullmatch(value) is None:
        raise BadRequest("pairs must be a non-negative integer of at most 6 digits.", param="pairs")
    return min(int(value), MAX_RECENT_PAIRS)


def _audit_query(scope: Scope, policies: PolicySet) -> tuple[str | None, datetime | None]:
    query = admin_query(scope, frozenset({"tenant", "since"}))
    tenant = query.get("tenant")
    if tenant is not None and tenant not in policies.tenants and tenant != RESERVED_TENANT:
        raise NotFound("No such tenant.", param="tenant")
    since = query.get("since")
    try:
        return tenant, parse_since(since) if since else None
    except (ValueError, OverflowError):
        raise BadRequest("since must be an ISO 8601 time, e.g. 2026-11-29T12:00:00Z.", param="since") from None
