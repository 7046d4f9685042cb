"""The request path for forwarded routes: body → rewrite → pool → upstream → relay to the client.

Streams are relayed chunk by chunk as they arrive; the only per-chunk work is a byte scan for the
first generated content (TTFT) and for the usage event. A client that goes away cancels the relay,
which closes the upstream connection, so upstream stops generating.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import msgspec

from gateway.errors import UnsupportedMediaType, openai_error_body
from gateway.http.asgi import (
    JSON_TYPE,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_body,
    start_message,
)
from gateway.http.disconnect import DisconnectGuard
from gateway.http.routes import Kind, RouteSpec
from gateway.policy.loader import PolicySet
from gateway.policy.model import TenantPolicy
from gateway.proxy.assemble import StreamAssembler
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.record import Exchange
from gateway.proxy.rewrite import RewrittenRequest, parse_json_object, rewrite_request
from gateway.proxy.rollout import choose_pool
from gateway.proxy.sse import StreamWatch, usage_from_json
from gateway.proxy.upstream import open_first_reachable, upstream_errors, upstream_headers
from gateway.shadow.compare import ArmResult, generated_text
from gateway.shadow.runner import PrimarySlot, ShadowCall, ShadowRunner

STREAM_FAILURES = (aiohttp.ClientError, TimeoutError)
UserSaltSink = Callable[[str, int, str], None]
RESPONSES_PATH = "/v1/responses"


@dataclass(frozen=True)
class Outbound:
    """One prepared upstream request."""

    method: str
    candidates: list[str]  # upstreams of the pool, best first
    target: str  # path and query
    headers: dict[str, str]
    body: bytes | None
    prepared: RewrittenRequest | None


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, salt_secret: bytes, health: UpstreamHealth,
                 shadow: ShadowRunner | None, remember_user_salt: UserSaltSink) -> None:
        self.session = session
        self.salt_secret = salt_secret
        self.health = health
        self.shadow = shadow
        self.remember_user_salt = remember_user_salt

    async def forward(
        self, ex: Exchange, policies: PolicySet, tenant: TenantPolicy, route: RouteSpec,
        scope: Scope, receive: Receive, send: Send,
    ) -> None:
        outbound = await self._outbound(ex, policies, tenant, route, scope, receive)
        slot = self._mirror(ex, policies, tenant, route, outbound)
        try:
            async with DisconnectGuard(receive) as guard:
                await self._relay(ex, route, outbound, send)
            if guard.disconnected:
                ex.outcome = "client_disconnected"
                ex.status = ex.status or 499
        finally:
            if slot is not None:
                slot.set(primary_result(ex))

    def _mirror(
        self, ex: Exchange, policies: PolicySet, tenant: TenantPolicy, route: RouteSpec, outbound: Outbound
    ) -> PrimarySlot | None:
        prepared = outbound.prepared
        if self.shadow is None or prepared is None or route.kind is not Kind.GENERATE:
            return None
        if not self.shadow.sampled(tenant, ex.request_id, ex.pool):
            return None
        shadow_id = f"{ex.request_id}-shadow"
        call = ShadowCall(tenant=tenant.tenant, primary_pool=ex.pool, path=route.path, request_id=shadow_id,
                          headers={**outbound.headers, "x-request-id": shadow_id}, body=prepared.body,
                          streamed=prepared.upstream_stream, deterministic=prepared.deterministic,
                          affinity=prepared.affinity)
        slot = self.shadow.mirror(policies, tenant, call)
        if slot is not None:
            ex.capture = bytearray()
        return slot

    async def _outbound(
        self, ex: Exchange, policies: PolicySet, tenant: TenantPolicy, route: RouteSpec,
        scope: Scope, receive: Receive,
    ) -> Outbound:
        body = await self._body(scope, receive, route, policies)
        prepared = self._prepare(body, route, tenant, scope)
        ex.model = prepared.model if prepared is not None else None
        ex.pool = choose_pool(policies, tenant, prepared.user if prepared else None, ex.request_id)
        pool = policies.gateway.pools[ex.pool]
        candidates = self.health.candidates(pool.upstreams, prepared.affinity if prepared else tenant.tenant)
        query = scope.get("query_string", b"")
        target = route.path + (f"?{query.decode('latin-1')}" if query else "")
        headers = upstream_headers(scope["headers"], ex.pool, pool, ex.request_id)
        sent_body = (prepared.body if prepared is not None else body) if scope["method"] == "POST" else None
        return Outbound(scope["method"], candidates, target, headers, sent_body, prepared)

    async def _body(self, scope: Scope, receive: Receive, route: RouteSpec, policies: PolicySet) -> bytes:
        if scope["method"] != "POST":
            return b""
        content_type = (header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
        if content_type != JSON_TYPE:
            raise UnsupportedMediaType("The request body must be JSON (Content-Type: application/json).")
        return await read_body(scope, receive, policies.gateway.max_body_bytes)

    def _prepare(self, body: bytes, route: RouteSpec, tenant: TenantPolicy, scope: Scope) -> RewrittenRequest | None:
        if route.kind is Kind.FORWARD:
            if scope["method"] == "POST":
                parse_json_object(body)
            return None
        user_header = tenant.rollout.user_header
        header_user = header(scope, user_header.lower().encode()) if user_header else None
        user = header_user.decode("latin-1") if header_user else None
        prepared = rewrite_request(body, route, tenant, self.salt_secret, user)
        if tenant.cache.isolation == "user" and prepared.user is not None:
            # The ledger can only attribute per-user salts it was told about.
            self.remember_user_salt(tenant.tenant, tenant.cache.salt_epoch, prepared.user)
        return prepared

    async def _relay(self, ex: Exchange, route: RouteSpec, outbound: Outbound, send: Send) -> None:
        ex.sent_at = time.perf_counter()
        ex.overhead_s = ex.sent_at - ex.started
        with upstream_errors(ex.pool):
            ex.upstream, response = await open_first_reachable(
                self.session, self.health, outbound.candidates, outbound.method, outbound.target, outbound.headers,
                outbound.body)
        try:
            await self._relay_response(ex, route, outbound, response, send)
        except BaseException:
            response.close()
            raise
        response.release()

    async def _relay_response(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, response: aiohttp.ClientResponse, send: Send
    ) -> None:
        ex.status = response.status
        prepared = outbound.prepared
        if response.status != 200 or prepared is None or not prepared.upstream_stream:
            await self._relay_whole(ex, route, response, send)
        elif prepared.assemble:
            await self._relay_assembled(ex, route, response, send)
        else:
            await self._relay_stream(ex, route, prepared, response, send)

    def _headers(self, ex: Exchange, response: aiohttp.ClientResponse, received: float) -> list[tuple[bytes, bytes]]:
        ex.overhead_s += time.perf_counter() - received
        content_type = response.headers.get("content-type", "application/json")
        return [
            (b"content-type", content_type.encode("latin-1")),
            (b"x-request-id", ex.request_id.encode()),
            (b"x-kvgate-pool", ex.pool.encode()),
            (b"x-kvgate-overhead-ms", f"{ex.overhead_s * 1000:.3f}".encode()),
        ]

    async def _relay_whole(self, ex: Exchange, route: RouteSpec, response: aiohttp.ClientResponse, send: Send) -> None:
        with upstream_errors(ex.pool):
            body = await response.read()
        received = time.perf_counter()
        if ex.capture is not None:
            ex.capture += body
        if response.status == 200 and route.kind is Kind.GENERATE:
            ex.usage = usage_from_json(body)
        await send_body(send, response.status, body, self._headers(ex, response, received))

    async def _relay_stream(
        self, ex: Exchange, route: RouteSpec, prepared: RewrittenRequest, response: aiohttp.ClientResponse,
        send: Send,
    ) -> None:
        await send(start_message(200, self._headers(ex, response, time.perf_counter())))
        watch = StreamWatch(prepared.strip_usage)
        try:
            async for chunk in response.content.iter_any():
                forward, first = watch.feed(chunk)
                if first:
                    ex.ttft_s = time.perf_counter() - ex.started
                if forward:
                    await send({"type": "http.response.body", "body": forward, "more_body": True})
                if ex.capture is not None:
                    ex.capture += chunk
            tail = watch.flush()
        except STREAM_FAILURES as error:
            ex.outcome = "upstream_failed_mid_stream"
            tail = stream_error_event(route.path, f"Upstream stream failed: {type(error).__name__}.")
        ex.usage = watch.usage
        await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _relay_assembled(
        self, ex: Exchange, route: RouteSpec, response: aiohttp.ClientResponse, send: Send
    ) -> None:
        watch = StreamWatch(strip_usage=False)
        assembler = StreamAssembler(chat=route.path == "/v1/chat/completions")
        with upstream_errors(ex.pool):
            async for chunk in response.content.iter_any():
                if watch.feed(chunk)[1]:
                    ex.ttft_s = time.perf_counter() - ex.started
                assembler.feed(chunk)
                if ex.capture is not None:
                    ex.capture += chunk
        received = time.perf_counter()
        ex.usage = watch.usage
        status, body = assembler.result()
        ex.status = status
        headers = [(b"content-type", JSON_TYPE), *self._headers(ex, response, received)[1:]]
        await send_body(send, status, msgspec.json.encode(body), headers)


def primary_result(ex: Exchange) -> ArmResult | None:
    """The primary arm of a shadow pair, timed from its upstream send like the shadow arm."""
    if ex.capture is None or ex.sent_at == 0.0 or ex.outcome != "ok":
        return None
    ttft = None if ex.ttft_s is None else ex.ttft_s - (ex.sent_at - ex.started)
    cached = ex.usage.cached_tokens if ex.usage is not None else None
    duration = time.perf_counter() - ex.sent_at
    return ArmResult(ex.request_id, ex.status, ttft, duration, cached, generated_text(bytes(ex.capture)))


def stream_error_event(path: str, message: str) -> bytes:
    error = msgspec.json.encode(openai_error_body(message, "upstream_error", None, 502))
    if path == RESPONSES_PATH:
        return b"event: error\ndata: " + error + b"\n\n"
    return b"data: " + error + b"\n\ndata: [DONE]\n\n"
