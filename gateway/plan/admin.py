"""`GET /admin/plan` (admin scope): the plan as JSON, from this gateway's trace and the pool's first upstream.

Query: `tenant`, `since` (ISO time), `window` (e.g. `10m,1h,24h`), `pool`, `cpu_bytes` (repeatable), and the
host budgets `host_ram`, `weights_bytes`, `headroom`, `cache_process_rss`, `current_cpu_bytes` (bytes),
`link_gbps`, `prefill_tokens_per_s`, `server_ignores_max_load` (true|false). What cannot be read stays null in
the answer, never 0.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from typing import Any
from urllib.parse import parse_qs

from gateway.errors import BadRequest, NotFound, ServiceUnavailable
from gateway.isotime import parse_since
from gateway.plan.build import H200_LINK_BYTES_PER_S, PlanInputs, build_plan
from gateway.plan.kvsize import prefill_seconds_per_token, server_cache_from_metrics
from gateway.plan.workingset import parse_window
from gateway.policy.loader import PolicySet
from gateway.proxy.smallcalls import SmallCalls, client_error, read_small, total_timeout
from gateway.reuse.trace import ReuseTrace
from gateway.storage import errors_with_redis

BYTE_PARAMS = ("host_ram", "weights_bytes", "headroom", "cache_process_rss", "current_cpu_bytes")
MAX_EVALUATED = 16


async def plan_view(trace: ReuseTrace | None, policies: PolicySet, calls: SmallCalls,
                    query_string: bytes) -> dict[str, Any]:
    query = parse_qs(query_string.decode("latin-1"))
    inputs = _inputs(query, policies)
    if trace is None:
        raise NotFound("The reuse trace is off on this gateway (KVGATE_REUSE_TRACE=false).")
    await trace.flush()
    try:
        records = await trace.store.read(inputs.tenant, inputs.since)
    except errors_with_redis(sqlite3.Error) as error:
        raise ServiceUnavailable(
            f"The reuse trace store cannot be read now ({type(error).__name__}); try again.") from error
    pool = inputs.pool or policies.gateway.default_pool
    metrics = await _upstream_metrics(calls, policies.gateway.pools[pool].upstreams[0])
    server = server_cache_from_metrics(metrics) if metrics else None
    prefill = inputs.prefill_s_per_token or (prefill_seconds_per_token(metrics) if metrics else None)
    inputs = dataclasses.replace(inputs, server=server, prefill_s_per_token=prefill, pool=pool)
    plan = await asyncio.to_thread(build_plan, records, inputs)
    if metrics is None:
        plan["warnings"].append(f"could not read /metrics of pool {pool!r}'s first upstream")
    return plan


def _inputs(query: dict[str, list[str]], policies: PolicySet) -> PlanInputs:
    tenant = _one(query, "tenant")
    if tenant is not None and tenant not in policies.tenants:
        raise NotFound(f"No tenant {tenant!r}.", param="tenant")
    pool = _one(query, "pool")
    if pool is not None and pool not in policies.gateway.pools:
        raise NotFound(f"No pool {pool!r}.", param="pool")
    since_text = _one(query, "since")
    try:
        since = parse_since(since_text).timestamp() if since_text else None
    except ValueError:
        raise BadRequest("since must be an ISO 8601 time, e.g. 2026-12-01T12:00:00Z.", param="since") from None
    try:
        windows = [parse_window(part) for part in (_one(query, "window") or "10m,1h,24h").split(",") if part]
    except ValueError as error:
        raise BadRequest(str(error), param="window") from None
    sizes = {name: _bytes(query, name) for name in BYTE_PARAMS}
    evaluated = [_positive_int(value, "cpu_bytes") for value in query.get("cpu_bytes", [])[:MAX_EVALUATED]]
    link = _positive_float(_one(query, "link_gbps"), "link_gbps")
    prefill = _positive_float(_one(query, "prefill_tokens_per_s"), "prefill_tokens_per_s")
    ignores = _one(query, "server_ignores_max_load")
    if ignores not in (None, "true", "false"):
        raise BadRequest("server_ignores_max_load must be true or false.", param="server_ignores_max_load")
    return PlanInputs(windows_s=windows, host_ram_bytes=sizes["host_ram"], weights_bytes=sizes["weights_bytes"],
                      headroom_bytes=sizes["headroom"], cache_process_rss_bytes=sizes["cache_process_rss"],
                      current_cpu_bytes=sizes["current_cpu_bytes"], evaluate_cpu_bytes=evaluated,
                      link_bytes_per_s=link * 1e9 if link else H200_LINK_BYTES_PER_S,
                      prefill_s_per_token=1.0 / prefill if prefill else None, pool=pool, tenant=tenant, since=since,
                      honour_max_load=ignores != "true")


def _one(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _bytes(query: dict[str, list[str]], name: str) -> int | None:
    value = _one(query, name)
    return None if value is None else _positive_int(value, name)


def _positive_int(value: str, name: str) -> int:
    if not (value.isascii() and value.isdigit()):  # str.isdigit alone passes "²", which int() refuses
        raise BadRequest(f"{name} must be a whole number of bytes.", param=name)
    return int(value)


def _positive_float(value: str | None, name: str) -> float | None:
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number > 0 or number == float("inf"):
        raise BadRequest(f"{name} must be a positive number.", param=name)
    return number


async def _upstream_metrics(calls: SmallCalls, upstream: str) -> str | None:
    session = await calls.session()
    try:
        async with session.get(f"{upstream}/metrics", timeout=total_timeout(5)) as response:
            return (await read_small(response)).decode("utf-8", "replace") if response.status == 200 else None
    except (client_error(), TimeoutError):
        return None
