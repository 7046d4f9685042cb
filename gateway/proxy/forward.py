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

from gateway.errors import GatewayError, UnsupportedMediaType, openai_error_body
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
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.model import TenantPolicy
from gateway.proxy.assemble import StreamAssembler
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.misspath import (
    Action,
    Failure,
    RecomputeMethods,
    action_for,
    one_time_user,
    peek_stream,
    recompute_body,
)
from gateway.proxy.record import Exchange
from gateway.proxy.rewrite import (
    CHUNK_STREAM_PATHS,
    DraftRequest,
    RewrittenRequest,
    draft_request,
    finish_request,
    parse_json_object,
    refuse_offload,
)
from gateway.proxy.rollout import choose_pool
from gateway.proxy.sse import StreamWatch, usage_from_json
from gateway.proxy.upstream import open_first_reachable, pool_auth, upstream_errors, upstream_headers
from gateway.reuse.fingerprint import canonical_prompt
from gateway.reuse.shared import Admission, rule_of
from gateway.salts import derive_salt
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
    miss_path: MissPlan | None = None  # set when a pre-first-byte failure may be retried


@dataclass(frozen=True)
class MissPlan:
    """What a retry needs to know about the request's tenant and pools."""

    policies: PolicySet
    tenant: TenantPolicy
    first_pool: str

    def retry_pools(self) -> list[str]:
        """Recompute on the same pool, then the rollout's other arm when there is one."""
        else_pool = self.tenant.rollout.else_pool
        return [self.first_pool] + ([else_pool] if else_pool is not None and else_pool != self.first_pool else [])


class Proxy:
    def __init__(self, session: aiohttp.ClientSession, salt_secret: bytes, health: UpstreamHealth,
                 shadow: ShadowRunner | None, remember_user_salt: UserSaltSink,
                 metrics: GatewayMetrics | None = None, admission: Admission | None = None) -> None:
        self.session = session
        self.salt_secret = salt_secret
        self.health = health
        self.shadow = shadow
        self.remember_user_salt = remember_user_salt
        self.metrics = metrics
        self.admission = admission
        self.recompute = RecomputeMethods(session)

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
        draft = self._prepare(body, route, tenant, scope)
        if draft is not None and route.kind is Kind.GENERATE and tenant.offload.admission.mode == "returning":
            await self._admit(ex, tenant, draft)
        prepared = finish_request(draft) if draft is not None else None
        ex.model = prepared.model if prepared is not None else None
        ex.pool = choose_pool(policies, tenant, prepared.user if prepared else None, ex.request_id)
        pool = policies.gateway.pools[ex.pool]
        candidates = self.health.candidates(pool.upstreams, prepared.affinity if prepared else tenant.tenant)
        query = scope.get("query_string", b"")
        target = route.path + (f"?{query.decode('latin-1')}" if query else "")
        headers = upstream_headers(scope["headers"], ex.pool, pool, ex.request_id)
        sent_body = (prepared.body if prepared is not None else body) if scope["method"] == "POST" else None
        retry = tenant.offload.miss_path == "retry" and route.kind is Kind.GENERATE and prepared is not None
        plan = MissPlan(policies, tenant, ex.pool) if retry else None
        return Outbound(scope["method"], candidates, target, headers, sent_body, prepared, plan)

    async def _admit(self, ex: Exchange, tenant: TenantPolicy, draft: DraftRequest) -> None:
        """Offload admission: a prefix not seen often enough recently stores nothing in the offload tier."""
        if self.admission is None:
            return
        rule = rule_of(tenant.offload.admission)
        key = self.admission.key_for(tenant.tenant, canonical_prompt(draft.request), rule.prefix_chunks)
        result, store_failed = await self.admission.admit(tenant.tenant, key, rule)
        if self.metrics is not None:
            self.metrics.offload_admission.labels(tenant.tenant, result.decision).inc()
            if store_failed:
                self.metrics.offload_admission_errors.labels(tenant.tenant).inc()
        if not result.admitted:
            refuse_offload(draft.request)
        ex.extra["admission"] = result.decision

    async def _body(self, scope: Scope, receive: Receive, route: RouteSpec, policies: PolicySet) -> bytes:
        if scope["method"] != "POST":
            return b""
        content_type = (header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
        if content_type != JSON_TYPE:
            raise UnsupportedMediaType("The request body must be JSON (Content-Type: application/json).")
        return await read_body(scope, receive, policies.gateway.max_body_bytes)

    def _prepare(self, body: bytes, route: RouteSpec, tenant: TenantPolicy, scope: Scope) -> DraftRequest | None:
        if route.kind is Kind.FORWARD:
            if scope["method"] == "POST":
                parse_json_object(body)
            return None
        user_header = tenant.rollout.user_header
        header_user = header(scope, user_header.lower().encode()) if user_header else None
        user = header_user.decode("latin-1") if header_user else None
        prepared = draft_request(body, route, tenant, self.salt_secret, user)
        if tenant.cache.isolation == "user" and prepared.user is not None:
            # The ledger can only attribute per-user salts it was told about.
            self.remember_user_salt(tenant.tenant, tenant.cache.salt_epoch, prepared.user)
        return prepared

    async def _relay(self, ex: Exchange, route: RouteSpec, outbound: Outbound, send: Send) -> None:
        if outbound.miss_path is not None:
            await self._relay_with_miss_path(ex, route, outbound, outbound.miss_path, send)
            return
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

    # -- the miss path (gateway/proxy/misspath.py) ------------------------------------------------

    async def _relay_with_miss_path(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, plan: MissPlan, send: Send
    ) -> None:
        failure = await self._attempt(ex, route, outbound, send, first=True)
        if failure is None:
            return
        trail: list[dict[str, str]] = [{"pool": ex.pool, "failure": failure.cause}]
        ex.extra["miss_path"] = trail
        for number, pool_name in enumerate(plan.retry_pools(), start=1):
            ex.pool = pool_name
            try:
                retry, action = await self._retry_outbound(ex, outbound, plan, pool_name, number)
            except GatewayError as error:
                failure = Failure(type(error).__name__, error=error)
                self._count_miss(plan, pool_name, "else_pool", failure)
                trail.append({"pool": pool_name, "action": "else_pool", "result": "failed", "failure": failure.cause})
                continue
            next_failure = await self._attempt(ex, route, retry, send)
            self._count_miss(plan, pool_name, action, next_failure)
            trail.append({"pool": pool_name, "action": action, "result": "ok" if next_failure is None else "failed",
                          **({"failure": next_failure.cause} if next_failure is not None else {})})
            if next_failure is None:
                return
            failure = next_failure
        await self._deliver_failure(ex, route, outbound, failure, send)

    def _count_miss(self, plan: MissPlan, pool: str, action: Action, failure: Failure | None) -> None:
        if self.metrics is not None:
            result = "ok" if failure is None else "failed"
            self.metrics.miss_path.labels(plan.tenant.tenant, pool, action, result).inc()

    async def _retry_outbound(
        self, ex: Exchange, outbound: Outbound, plan: MissPlan, pool_name: str, number: int
    ) -> tuple[Outbound, Action]:
        prepared = outbound.prepared
        assert prepared is not None
        pool = plan.policies.gateway.pools[pool_name]
        candidates = self.health.candidates(pool.upstreams, prepared.affinity)
        method = await self.recompute.method(pool, candidates[0])
        tenant = plan.tenant
        salt = ""
        if method == "salt":
            user = one_time_user(ex.request_id)
            salt = derive_salt(self.salt_secret, tenant.tenant, tenant.cache.salt_epoch, user)
            self.remember_user_salt(tenant.tenant, tenant.cache.salt_epoch, user)  # its blocks stay attributed
        retry_id = f"{ex.request_id}-retry{number}"
        kept = {name: value for name, value in outbound.headers.items() if name != "authorization"}
        headers = kept | {"x-request-id": retry_id} | pool_auth(pool_name, pool)
        body = recompute_body(prepared.body, method, salt)
        action: Action = action_for(method) if pool_name == plan.first_pool else "else_pool"
        return Outbound(outbound.method, candidates, outbound.target, headers, body, prepared), action

    async def _attempt(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, send: Send, first: bool = False
    ) -> Failure | None:
        """Send once; relay the answer unless it failed before its first byte (then say how)."""
        ex.sent_at = time.perf_counter()
        if first:  # the gateway's own overhead is measured up to the first send; retries are upstream time
            ex.overhead_s = ex.sent_at - ex.started
        try:
            with upstream_errors(ex.pool):
                ex.upstream, response = await open_first_reachable(
                    self.session, self.health, outbound.candidates, outbound.method, outbound.target,
                    outbound.headers, outbound.body)
        except GatewayError as error:
            return Failure(_cause(error), error=error)
        try:
            failure = await self._screen(ex, route, outbound, response, send)
        except BaseException:
            response.close()
            raise
        if failure is not None:
            response.close()
        else:
            response.release()
        return failure

    async def _screen(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, response: aiohttp.ClientResponse, send: Send
    ) -> Failure | None:
        prepared = outbound.prepared
        assert prepared is not None
        content_type = response.headers.get("content-type", "application/json")
        if response.status >= 500:
            try:
                with upstream_errors(ex.pool):
                    body = await response.read()
            except GatewayError as error:
                return Failure(_cause(error), error=error)
            return Failure(f"status_{response.status}", status=response.status, body=body, content_type=content_type)
        preread: list[bytes] = []
        if response.status == 200 and prepared.upstream_stream and route.path in CHUNK_STREAM_PATHS:
            try:
                with upstream_errors(ex.pool):
                    peeked = await peek_stream(response)
            except GatewayError as error:
                return Failure(_cause(error), error=error)
            if peeked.error_first:
                return Failure("error_event", chunks=peeked.chunks, content_type=content_type)
            preread = peeked.chunks
        whole_before_sending = not prepared.upstream_stream or prepared.assemble
        try:
            await self._relay_response(ex, route, outbound, response, send, preread)
        except GatewayError as error:
            if not whole_before_sending:
                raise
            return Failure(_cause(error), error=error)  # nothing was sent: the body is read before replying
        return None

    async def _deliver_failure(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, failure: Failure, send: Send
    ) -> None:
        """Every attempt failed: the client gets the last failure as it would have without the miss path."""
        ex.outcome = "miss_path_exhausted"
        if failure.error is not None:
            raise failure.error
        prepared = outbound.prepared
        headers = [(b"x-request-id", ex.request_id.encode()), (b"x-kvgate-pool", ex.pool.encode())]
        if not failure.chunks:
            ex.status = failure.status
            await send_body(send, failure.status, failure.body,
                            [(b"content-type", failure.content_type.encode("latin-1")), *headers])
            return
        if prepared is not None and prepared.assemble:
            assembler = StreamAssembler(chat=route.path == "/v1/chat/completions")
            for chunk in failure.chunks:
                assembler.feed(chunk)
            ex.status, body = assembler.result()
            await send_body(send, ex.status, msgspec.json.encode(body), [(b"content-type", JSON_TYPE), *headers])
            return
        ex.status = 200
        await send(start_message(200, [(b"content-type", failure.content_type.encode("latin-1")), *headers]))
        await send({"type": "http.response.body", "body": b"".join(failure.chunks), "more_body": False})

    # -- relaying an answer -----------------------------------------------------------------------

    async def _relay_response(
        self, ex: Exchange, route: RouteSpec, outbound: Outbound, response: aiohttp.ClientResponse, send: Send,
        preread: list[bytes] | None = None,
    ) -> None:
        ex.status = response.status
        prepared = outbound.prepared
        if response.status != 200 or prepared is None or not prepared.upstream_stream:
            await self._relay_whole(ex, route, response, send)
        elif prepared.assemble:
            await self._relay_assembled(ex, route, response, send, preread or [])
        else:
            await self._relay_stream(ex, route, prepared, response, send, preread or [])

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
        send: Send, preread: list[bytes],
    ) -> None:
        await send(start_message(200, self._headers(ex, response, time.perf_counter())))
        watch = StreamWatch(prepared.strip_usage)
        try:
            for chunk in preread:  # held back by the miss path until the stream showed content
                await self._pass_chunk(ex, watch, chunk, send)
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

    async def _pass_chunk(self, ex: Exchange, watch: StreamWatch, chunk: bytes, send: Send) -> None:
        forward, first = watch.feed(chunk)
        if first:
            ex.ttft_s = time.perf_counter() - ex.started
        if forward:
            await send({"type": "http.response.body", "body": forward, "more_body": True})
        if ex.capture is not None:
            ex.capture += chunk

    async def _relay_assembled(
        self, ex: Exchange, route: RouteSpec, response: aiohttp.ClientResponse, send: Send, preread: list[bytes]
    ) -> None:
        watch = StreamWatch(strip_usage=False)
        assembler = StreamAssembler(chat=route.path == "/v1/chat/completions")
        for chunk in preread:
            if watch.feed(chunk)[1]:
                ex.ttft_s = time.perf_counter() - ex.started
            assembler.feed(chunk)
            if ex.capture is not None:
                ex.capture += chunk
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


def _cause(error: GatewayError) -> str:
    """The underlying failure's name (ClientConnectorError, ServerDisconnectedError, TimeoutError, ...)."""
    return type(error.__cause__).__name__ if error.__cause__ is not None else type(error).__name__


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
