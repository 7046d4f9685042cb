"""The request path for forwarded routes: body → rewrite → pool → upstream → relay to the client.

Streams are relayed chunk by chunk as they arrive, from the upstream connection's read callback (ClientSink):
the only per-chunk work is a byte scan for the first generated content (TTFT) and for the usage event, and the
server's `send`, which the request task finishes only when it has to wait for a slow client. A client that goes
away cancels the relay, which closes the upstream connection, so upstream stops generating.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

import msgspec
from prometheus_client import Counter

from gateway.asgi.body_writer import BodyWriter, body_writer
from gateway.asgi.disconnect import DisconnectGuard, disconnect_notice
from gateway.asgi.inline import Ready, Step, run_for_result, run_until_blocked
from gateway.asgi.io import (
    JSON_TYPE,
    Message,
    Receive,
    Scope,
    Send,
    header,
    read_body,
    send_body,
    start_message,
)
from gateway.errors import (
    BadRequest,
    GatewayError,
    RequestTimeout,
    UnsupportedMediaType,
    UpstreamAnswerTooLarge,
    openai_error_body,
)
from gateway.metrics import ChildCache
from gateway.outcomes import Outcome
from gateway.policy.loader import PolicySet
from gateway.policy.model import TenantPolicy
from gateway.proxy.assemble import StreamAssembler
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Admitted, Call, Features, Finish, Inbound, Outbound
from gateway.proxy.misspath import (
    ErrorFirst,
    Failure,
    HeldUntilContent,
    MissPath,
    Peeked,
    peek_stream,
    rest_of_error,
)
from gateway.proxy.rawprompt import parse_json_object
from gateway.proxy.record import Exchange
from gateway.proxy.rewrite import RewrittenRequest, encode_for_pool, rewrite_request
from gateway.proxy.rollout import choose_pool
from gateway.proxy.shape import JsonLimits, check_json_shape, check_user_value
from gateway.proxy.sse import StreamWatch, usage_from_json
from gateway.proxy.upstream import (
    AnswerTooLarge,
    UpstreamClient,
    UpstreamResponse,
    UpstreamTransportError,
    open_first_reachable,
    upstream_errors,
    upstream_headers,
)
from gateway.routes import Kind, RouteSpec, StreamStyle
from gateway.salts import Salts

STREAM_FAILURES = (UpstreamTransportError, TimeoutError)
# Query strings travel upstream only in this conservative RFC 3986 form (no spaces, quotes or raw non-ASCII).
FORWARDABLE_QUERY = re.compile(rb"[A-Za-z0-9._~%!$&'()*+,;=:@/?-]{0,2048}")
IDENTITY = "identity"
DEFAULT_JSON_LIMITS = JsonLimits(max_depth=64, max_items=262_144)
DEFAULT_BODY_TIMEOUT_S = 60.0


@dataclass
class ResponseHead:
    """A miss-path answer's response head, across its attempts. A held stream's head goes out when its upstream's
    head arrives, as the plain relay's does, so the client reads it while the engine prefills rather than on the
    path to the first token (with the head held too, that cost 0.15-0.2 ms of TTFT at c=1, nearly all of it
    outside the gateway's own timing; loadtests/reports/perf-2026-12-03b). Only the body is held until content.
    That is allowed (`early`) only where nothing in the head can change: every retry goes to this pool, so
    `x-kvgate-pool` stays true (a tenant with an else pool keeps the whole answer held, and its last failure is
    sent as it came). Once `sent`, a retry's answer continues the same response, and a last failure is an error
    event at its end, as a stream that fails midway ends."""

    early: bool
    sent: bool = False


class Relaying(msgspec.Struct, frozen=True):
    """One forwarded request from its send upstream on: its record, its context, and the client's connection."""

    ex: Exchange
    call: Call
    client: Inbound


@dataclass(frozen=True)
class ProxyOptions:
    json_limits: JsonLimits = DEFAULT_JSON_LIMITS
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    client_stalls: Counter | None = None  # by tenant: streams held back for a slow client (kvgate_client_stalls)
    events_unread: Counter | None = None  # by tenant: events too long to read (kvgate_stream_events_unread)


class Proxy:
    def __init__(self, client: UpstreamClient, salt_secret: bytes, health: UpstreamHealth,
                 features: Features, miss_path: MissPath | None = None, options: ProxyOptions = ProxyOptions()) -> None:
        self.client = client
        self.salt_secret = salt_secret  # for LMCache tags
        self.salts = Salts(salt_secret)
        self.health = health
        self.features = features
        self.miss_path = miss_path
        self.json_limits = options.json_limits
        self.body_timeout_s = options.body_timeout_s
        # By tenant, made at its first stream (the series then exist at 0 for dashboards).
        self.client_stalls = ChildCache(options.client_stalls) if options.client_stalls is not None else None
        self.events_unread = ChildCache(options.events_unread) if options.events_unread is not None else None

    async def forward(self, ex: Exchange, admitted: Admitted, inbound: Inbound) -> None:
        finishes: list[Finish] = []
        try:
            call, outbound = await self._outbound(ex, admitted, inbound, finishes)
            finishes += self.features.sent(call, outbound, ex)
            async with DisconnectGuard(inbound.receive, disconnect_notice(inbound.scope)) as guard:
                await self._relay(Relaying(ex, call, inbound), outbound)
            if guard.disconnected:
                ex.outcome = Outcome.CLIENT_DISCONNECTED
                ex.status = ex.status or 499
        finally:
            for finish in finishes:
                finish(ex)

    async def _outbound(
        self, ex: Exchange, admitted: Admitted, inbound: Inbound, finishes: list[Finish]
    ) -> tuple[Call, Outbound]:
        route, scope = admitted.route, inbound.scope
        body, ex.body_wait_s = await self._body(scope, inbound.receive, route, admitted.policies)
        if admitted.readmit is not None:
            # A slow body may outlast a reload: the request goes upstream under the set in force when it arrived,
            # never under an erased salt epoch or a key that was revoked meanwhile.
            admitted = admitted.readmit(admitted)
        policies, tenant = admitted.policies, admitted.tenant
        prepared = self._prepare(body, route, tenant, scope)
        if prepared is not None:
            body = b""  # the request replaces the client's bytes (a long prompt in it still points into them)
        ex.model = prepared.model if prepared is not None else None
        ex.dropped_fields = prepared.dropped_fields if prepared is not None else ()
        ex.pool = choose_pool(policies, tenant, prepared.user if prepared else None, ex.request_id)
        pool = policies.gateway.pools[ex.pool]
        call = Call(ex.request_id, policies, tenant, route, ex.pool, pool, prepared)
        if prepared is not None:
            finishes += await self.features.prepare(call, prepared.request)
            finishes += self.features.start(call, prepared.request)
        candidates = self.health.candidates(pool.upstreams, prepared.affinity if prepared else tenant.tenant)
        query = scope.get("query_string", b"")
        if FORWARDABLE_QUERY.fullmatch(query) is None:
            raise BadRequest("The query string holds characters that are not forwarded (use percent-encoding).")
        target = route.path + (f"?{query.decode('ascii')}" if query else "")
        headers = upstream_headers(scope["headers"], policies.pool_auth(ex.pool), ex.request_id)
        if prepared is not None:
            body = encode_for_pool(prepared, route, tenant, self.salt_secret, pool)
        sent_body = body if scope["method"] == "POST" else None
        return call, Outbound(scope["method"], candidates, target, headers, sent_body)

    async def _body(
        self, scope: Scope, receive: Receive, route: RouteSpec, policies: PolicySet
    ) -> tuple[bytes, float]:
        """The request body, and how long the gateway waited for the client to send the rest of it (seconds): that
        wait is the client's upload, not the gateway's overhead."""
        if scope["method"] != "POST":
            return b"", 0.0
        content_type = (header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
        if content_type != JSON_TYPE:
            raise UnsupportedMediaType("The request body must be JSON (Content-Type: application/json).")
        # A body the server already holds (the usual case: it came with the head) is read here without a timer.
        reading = run_for_result(read_body(scope, receive, policies.gateway.max_body_bytes))
        waited = 0.0
        if isinstance(reading, Ready):
            body = reading.value
        else:
            began = time.perf_counter()
            try:
                async with asyncio.timeout(self.body_timeout_s):
                    body = await reading
            except TimeoutError:
                raise RequestTimeout(f"The request body did not arrive within {self.body_timeout_s:g} s.") from None
            waited = time.perf_counter() - began
        check_json_shape(body, self.json_limits)
        return body, waited

    def _prepare(self, body: bytes, route: RouteSpec, tenant: TenantPolicy, scope: Scope) -> RewrittenRequest | None:
        if route.kind is Kind.FORWARD:
            if scope["method"] == "POST":
                parse_json_object(body)
            return None
        user_header = tenant.rollout.user_header
        header_user = header(scope, user_header.lower().encode()) if user_header else None
        check_user_value(header_user, user_header or "user")
        user = header_user.decode("latin-1") if header_user else None
        return rewrite_request(body, route, tenant, self.salts, user)

    async def _relay(self, relaying: Relaying, outbound: Outbound) -> None:
        if self.miss_path is not None and self.miss_path.applies(relaying.call):
            await self._relay_with_miss_path(relaying, outbound, self.miss_path)
            return
        ex = relaying.ex
        mark_sent(ex, first=True)
        with upstream_errors(ex.pool):
            ex.upstream, response = await open_first_reachable(self.client, self.health, outbound)
        try:
            await self._relay_response(relaying, response)
        except BaseException:
            response.close()
            raise
        response.release()

    # -- the miss path (gateway/proxy/misspath.py) ------------------------------------------------

    async def _relay_with_miss_path(self, relaying: Relaying, outbound: Outbound, miss: MissPath) -> None:
        ex, call = relaying.ex, relaying.call
        pools = miss.retry_pools(call)
        head = ResponseHead(early=all(pool == ex.pool for pool in pools))
        failure = await self._attempt(relaying, outbound, head, first=True)
        if failure is None:
            return
        trail: list[dict[str, str]] = [{"pool": ex.pool, "failure": failure.cause}]
        ex.miss_path = trail
        for number, pool_name in enumerate(pools, start=1):
            ex.pool = pool_name
            pool = call.policies.gateway.pools[pool_name]
            prepared = call.prepared
            assert prepared is not None
            candidates = self.health.candidates(pool.upstreams, prepared.affinity)
            retry, action = await miss.retry_outbound(call, outbound, candidates, pool_name,
                                                      f"{ex.request_id}-retry{number}")
            next_failure = await self._attempt(relaying, retry, head)
            miss.count(call, pool_name, action, next_failure is None)
            entry = {"pool": pool_name, "action": action, "result": "ok" if next_failure is None else "failed"}
            trail.append(entry if next_failure is None else {**entry, "failure": next_failure.cause})
            if next_failure is None:
                return
            failure = next_failure
        await self._deliver_failure(relaying, failure, head)

    async def _attempt(
        self, relaying: Relaying, outbound: Outbound, head: ResponseHead, first: bool = False
    ) -> Failure | None:
        """Send once; relay the answer unless it failed before its first content (then say how)."""
        ex = relaying.ex
        mark_sent(ex, first)
        try:
            with upstream_errors(ex.pool):
                ex.upstream, response = await open_first_reachable(self.client, self.health, outbound)
        except GatewayError as error:
            return Failure(_cause(error), error=error)
        try:
            failure = await self._screen(relaying, response, head)
        except BaseException:
            response.close()
            raise
        if failure is not None:
            response.close()
        else:
            response.release()
        return failure

    async def _screen(self, relaying: Relaying, response: UpstreamResponse, head: ResponseHead) -> Failure | None:
        """A failure before the first content, or None once the answer has been relayed."""
        ex, call = relaying.ex, relaying.call
        prepared = call.prepared
        assert prepared is not None
        content_type = response.headers.get("content-type", "application/json")
        screened = call.route.stream is StreamStyle.CHUNKS and content_encoding(response) == IDENTITY
        readable = response.status == 200 and prepared.upstream_stream and screened  # its events can be read
        held_stream = readable and not prepared.assemble
        if response.status >= 500 or (head.sent and not held_stream):  # after the head only a stream can follow
            cause = f"status_{response.status}" if response.status != 200 else "unreadable_after_head"
            if head.sent:  # its body would never be sent (an error event ends the stream): closed unread
                return Failure(cause, status=response.status)
            try:
                with upstream_errors(ex.pool):
                    body = await response.read(call.policies.gateway.max_answer_bytes)
            except GatewayError as error:
                return Failure(_cause(error), error=error)
            return Failure(cause, status=response.status, body=body, content_type=content_type)
        preread: Peeked | None = None
        if held_stream:  # events can be read, and are passed on as they come once content shows
            return await self._relay_held_stream(relaying, prepared, response, head)
        if readable:  # assembled: read, then sent whole
            try:
                with upstream_errors(ex.pool):
                    preread = await peek_stream(response)
            except GatewayError as error:
                return Failure(_cause(error), error=error)
            if preread.error_first:
                return Failure("error_event", chunks=preread.chunks, content_type=content_type)
        whole_before_sending = not prepared.upstream_stream or prepared.assemble
        try:
            await self._relay_response(relaying, response, preread)
        except GatewayError as error:
            if not whole_before_sending or isinstance(error, UpstreamAnswerTooLarge):
                raise  # a retry would bring an answer just as large: the engine's work is not done twice
            return Failure(_cause(error), error=error)  # nothing was sent: the body is read before replying
        return None

    async def _deliver_failure(self, relaying: Relaying, failure: Failure, head: ResponseHead) -> None:
        """Every attempt failed: the client gets the last failure as it would have without the miss path, or, where
        the head was sent, as the end of the stream it began."""
        if head.sent:
            await self._end_begun_stream(relaying, failure)
            return
        if failure.error is not None:
            raise failure.error
        ex, send = relaying.ex, relaying.client.send
        ex.outcome = Outcome.MISS_PATH_EXHAUSTED
        prepared = relaying.call.prepared
        headers = [(b"x-request-id", ex.request_id.encode()), (b"x-kvgate-pool", ex.pool.encode())]
        if not failure.chunks:
            ex.status = failure.status
            await send_body(send, failure.status, failure.body,
                            [(b"content-type", failure.content_type.encode("latin-1")), *headers])
            return
        if prepared is not None and prepared.assemble:
            assembler = StreamAssembler(chat=relaying.call.route.chat)
            for chunk in failure.chunks:
                assembler.feed(chunk)
            ex.status, body = assembler.result()
            await send_body(send, ex.status, msgspec.json.encode(body), [(b"content-type", JSON_TYPE), *headers])
            return
        ex.status = 200
        await send(start_message(200, [(b"content-type", failure.content_type.encode("latin-1")), *headers]))
        await send({"type": "http.response.body", "body": b"".join(failure.chunks), "more_body": False})

    @staticmethod
    async def _end_begun_stream(relaying: Relaying, failure: Failure) -> None:
        """The last failure after a held stream's head went out (nothing of its body has): the upstream's own error
        event where it sent one, else the gateway's, which names the failure."""
        ex = relaying.ex
        ex.outcome = Outcome.MISS_PATH_EXHAUSTED
        if failure.chunks:
            tail = b"".join(failure.chunks)
        elif failure.error is not None:
            tail = stream_error_event(relaying.call.route, str(failure.error))
        else:
            tail = stream_error_event(relaying.call.route, f"Every attempt failed; the last upstream answered "
                                                           f"{failure.status} ({failure.cause}).")
        await relaying.client.send({"type": "http.response.body", "body": tail, "more_body": False})

    # -- relaying an answer -----------------------------------------------------------------------

    async def _relay_response(
        self, relaying: Relaying, response: UpstreamResponse, preread: Peeked | None = None
    ) -> None:
        ex, prepared = relaying.ex, relaying.call.prepared
        ex.status = response.status
        if content_encoding(response) != IDENTITY:
            # Upstream ignored `Accept-Encoding: identity`; relay the bytes as they are, labelled (no scanning).
            ex.content_encoding = content_encoding(response)
            await self._relay_whole(relaying, response)
        elif response.status != 200 or prepared is None or not prepared.upstream_stream:
            await self._relay_whole(relaying, response)
        elif prepared.assemble:
            await self._relay_assembled(relaying, response, preread.chunks if preread is not None else [])
        else:
            await self._relay_stream(relaying, prepared, response)

    def _start(self, ex: Exchange, response: UpstreamResponse) -> Message:
        """The start of a streamed 200 answer, sent now."""
        return start_message(200, self._headers(ex, response, time.perf_counter()))

    def _headers(self, ex: Exchange, response: UpstreamResponse, received: float) -> list[tuple[bytes, bytes]]:
        ex.overhead_s += time.perf_counter() - received
        content_type = response.headers.get("content-type", "application/json")
        headers = [
            (b"content-type", content_type.encode("utf-8", "surrogateescape")),  # the bytes upstream sent
            (b"x-request-id", ex.request_id.encode()),
            (b"x-kvgate-pool", ex.pool.encode()),
            (b"x-kvgate-overhead-ms", f"{ex.overhead_s * 1000:.3f}".encode()),
        ]
        encoding = content_encoding(response)
        if encoding != IDENTITY:
            headers.append((b"content-encoding", encoding.encode("utf-8", "surrogateescape")))
        return headers

    async def _relay_whole(self, relaying: Relaying, response: UpstreamResponse) -> None:
        ex = relaying.ex
        with upstream_errors(ex.pool):
            body = await response.read(relaying.call.policies.gateway.max_answer_bytes)
        received = time.perf_counter()
        if ex.capture is not None:
            ex.keep_for_shadow(body)
        generation = relaying.call.route.kind is Kind.GENERATE
        if response.status == 200 and generation and content_encoding(response) == IDENTITY:
            ex.usage = usage_from_json(body)
        await send_body(relaying.client.send, response.status, body, self._headers(ex, response, received))

    async def _relay_stream(self, relaying: Relaying, prepared: RewrittenRequest, response: UpstreamResponse) -> None:
        ex, client = relaying.ex, relaying.client
        await client.send(self._start(ex, response))
        client_sink = self._client_sink(relaying, prepared, response)
        try:
            # Every later read is passed on from the connection's read callback, but the last: it goes out in
            # the same write as the terminating chunk below.
            last = await response.pump(client_sink.pass_on, keep_last=True)
            tail = client_sink.last(last) + client_sink.watch.flush()
        except STREAM_FAILURES as error:
            tail = self._failed_mid_stream(relaying, error)
        await self._end_stream(relaying, client_sink, tail)

    async def _relay_held_stream(
        self, relaying: Relaying, prepared: RewrittenRequest, response: UpstreamResponse, head: ResponseHead
    ) -> Failure | None:
        """`_relay_stream` for the miss path: nothing of the body is sent until the stream shows content
        (HeldUntilContent), so a stream that fails before it (an error event, a broken connection) is a Failure to
        retry. The head goes out now where it may (ResponseHead), else with the first content."""
        ex = relaying.ex
        ex.status = response.status
        if head.early and not head.sent:
            head.sent = True
            await relaying.client.send(self._start(ex, response))
        client_sink = self._client_sink(relaying, prepared, response)
        held = HeldUntilContent(client_sink.pass_on,
                                lambda content: self._start_held(relaying, response, content, client_sink, head),
                                response.redirect)
        try:
            last = await response.pump(held.pass_on, keep_last=True)
            if not held.released:  # the stream ended while held (a short answer): its last read decides
                found = held.screen(last) if last else None
                if (started := self._start_held(relaying, response, found == "content", client_sink, head)) \
                        is not None:
                    await started
                last = held.take_held()
            tail = client_sink.last(last) + client_sink.watch.flush()
        except ErrorFirst:
            try:
                with upstream_errors(ex.pool):
                    rest = await rest_of_error(response, held.size)
            except GatewayError as error:
                return Failure(_cause(error), error=error)
            return Failure("error_event", chunks=held.held + rest,
                           content_type=response.headers.get("content-type", "application/json"))
        except STREAM_FAILURES as error:
            if not held.released:
                return _failure_before_sending(ex.pool, error)
            tail = self._failed_mid_stream(relaying, error)
        await self._end_stream(relaying, client_sink, tail)
        return None

    def _client_sink(self, relaying: Relaying, prepared: RewrittenRequest, response: UpstreamResponse) -> ClientSink:
        ex, client = relaying.ex, relaying.client
        if self.client_stalls is not None:
            response.on_pause = self.client_stalls.get(ex.tenant).inc
        return ClientSink(ex, StreamWatch(prepared.strip_usage), client.server_send, body_writer(client.scope))

    def _start_held(
        self, relaying: Relaying, response: UpstreamResponse, content: bool, sink: ClientSink, head: ResponseHead
    ) -> Step | None:
        """Lets a held stream go, from the read callback, starting its response unless its head was sent; with
        `content`, the held reads hold the first generated content, so the watch is told so rather than decoding
        them again, and TTFT is taken here, where the watch would have taken it."""
        ex = relaying.ex
        if content:
            sink.watch.content_seen = True
            ex.ttft_s = time.perf_counter() - ex.started
        if head.sent:
            return None
        head.sent = True
        return run_until_blocked(relaying.client.send(self._start(ex, response)))

    @staticmethod
    def _failed_mid_stream(relaying: Relaying, error: Exception) -> bytes:
        relaying.ex.outcome = Outcome.UPSTREAM_FAILED_MID_STREAM
        return stream_error_event(relaying.call.route, f"Upstream stream failed: {type(error).__name__}.")

    async def _end_stream(self, relaying: Relaying, client_sink: ClientSink, tail: bytes) -> None:
        watch = client_sink.watch
        relaying.ex.usage = watch.usage
        if self.events_unread is not None:  # the tenant's series exists from its first stream, at 0 for dashboards
            unread = self.events_unread.get(relaying.ex.tenant)
            if watch.events_unread:
                unread.inc(watch.events_unread)
        await relaying.client.server_send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _relay_assembled(self, relaying: Relaying, response: UpstreamResponse, preread: list[bytes]) -> None:
        ex = relaying.ex
        watch = StreamWatch(strip_usage=False)
        assembler = StreamAssembler(chat=relaying.call.route.chat)
        for chunk in preread:
            if watch.feed(chunk)[1]:
                ex.ttft_s = time.perf_counter() - ex.started
            assembler.feed(chunk)
            if ex.capture is not None:
                ex.keep_for_shadow(chunk)
        limit = relaying.call.policies.gateway.max_answer_bytes
        with upstream_errors(ex.pool):
            while assembler.size <= limit and (chunk := await response.next_chunk()):
                if watch.feed(chunk)[1]:
                    ex.ttft_s = time.perf_counter() - ex.started
                assembler.feed(chunk)
                if ex.capture is not None:
                    ex.keep_for_shadow(chunk)
            if assembler.size > limit:  # held whole before answering: bounded like any answer read whole
                response.close()
                raise AnswerTooLarge(limit)
        received = time.perf_counter()
        ex.usage = watch.usage
        status, body = assembler.result()
        ex.status = status
        headers = [(b"content-type", JSON_TYPE), *self._headers(ex, response, received)[1:]]
        await send_body(relaying.client.send, status, msgspec.json.encode(body), headers)


class ClientSink:
    """Passes a stream's upstream reads to the client as they arrive (a `Sink` of UpstreamConnection.pump): the
    watch's scan, TTFT at the first content, the shadow's capture, and the server's `send`, run in the read
    callback until it would wait (gateway/asgi/inline.py); or, where the server offers one, its `BodyWriter`,
    which writes without an ASGI message whenever `send` would not wait (gateway/asgi/body_writer.py)."""

    __slots__ = ("ex", "send", "watch", "write")

    def __init__(self, ex: Exchange, watch: StreamWatch, send: Send, write: BodyWriter | None = None) -> None:
        self.ex = ex
        self.watch = watch
        self.send = send
        self.write = write if write is not None else _declines  # never None: one test fewer per read

    def pass_on(self, chunk: bytes) -> Step | None:
        """The `Sink`: a bound method, cheaper per read than an instance's `__call__`."""
        ex = self.ex
        forward, first = self.watch.feed(chunk)
        if first:
            ex.ttft_s = time.perf_counter() - ex.started
        if ex.capture is not None:
            ex.keep_for_shadow(chunk)
        if not forward or self.write(forward):
            return None
        return run_until_blocked(self.send({"type": "http.response.body", "body": forward, "more_body": True}))

    def last(self, chunk: bytes) -> bytes:
        """The stream's last read (UpstreamConnection.pump's `keep_last`), watched as every read is: the bytes to
        write with the end of the response, not on their own. (`pass_on`'s first half, repeated rather than
        called from there: that runs per event.)"""
        if not chunk:
            return b""
        ex = self.ex
        forward, first = self.watch.feed(chunk)
        if first:
            ex.ttft_s = time.perf_counter() - ex.started
        if ex.capture is not None:
            ex.keep_for_shadow(chunk)
        return forward


def _failure_before_sending(pool: str, error: Exception) -> Failure:
    """A transport failure before anything was sent, as the gateway error it would be without the miss path."""
    try:
        with upstream_errors(pool):
            raise error
    except GatewayError as gateway_error:
        return Failure(_cause(gateway_error), error=gateway_error)
    raise AssertionError("upstream_errors translates every stream failure")  # pragma: no cover


def _declines(body: bytes) -> bool:
    """ClientSink's writer where the server offers none: every body goes through `send`."""
    return False


def content_encoding(response: UpstreamResponse) -> str:
    return response.headers.get("content-encoding", IDENTITY).strip().lower() or IDENTITY


def _cause(error: GatewayError) -> str:
    """The underlying failure's name (UpstreamConnectError, UpstreamReadTimeout, ...)."""
    return type(error.__cause__).__name__ if error.__cause__ is not None else type(error).__name__


def stream_error_event(route: RouteSpec, message: str) -> bytes:
    error = msgspec.json.encode(openai_error_body(message, "upstream_error", None, 502))
    if route.stream is StreamStyle.RESPONSES:
        return b"event: error\ndata: " + error + b"\n\n"
    return b"data: " + error + b"\n\ndata: [DONE]\n\n"


def mark_sent(ex: Exchange, first: bool) -> None:
    """The upstream request leaves now. The gateway's own overhead is measured up to the first send (a retry's
    time is upstream time), less the wait for the client to send the rest of its body (its upload)."""
    ex.sent_at = time.perf_counter()
    if first:
        ex.overhead_s = ex.sent_at - ex.started - ex.body_wait_s
