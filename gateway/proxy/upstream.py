"""Upstream HTTP for the relay and the shadow: pooled keep-alive connections, upstream choice, and one place that
maps errors.

The client is an `asyncio.Protocol` driven by httptools (the parser uvicorn uses): each socket read is one parser
call, instead of a general client's per-chunk stream machinery (aiohttp spent about 15 Python calls per SSE
event). `pump` hands each read to a callback as it arrives: the relay passes streams on to its client from there
(gateway/proxy/forward.py, ClientSink) and the shadow collects and times its answers that way
(gateway/shadow/client.py), so neither task wakes per read. `next_chunk` instead wakes the caller with
everything that arrived since its last wake-up (whole answers, and the miss path's peek at an answer the relay
assembles). The miss path's hold of a stream is a sink of its own, which `redirect`s the pump to the relay's sink
once it has seen the first content. The shadow has its own instance, so primaries never wait for its slots.
Measured figures: docs/proxy-costs.md.

Bounded: at most `connections` requests in flight upstream at once (further ones wait for a slot); a response
body buffered faster than the client takes it pauses reading from upstream at `PAUSE_AT_BYTES`.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from gateway.errors import UpstreamAnswerTooLarge, UpstreamTimeout, UpstreamUnavailable
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Outbound

# Inbound headers that may travel upstream; everything else (keys, hop-by-hop headers, vLLM steering
# headers such as X-data-parallel-rank, X-Vllm-Priority, X-Session-ID) is dropped.
FORWARDED_HEADERS = frozenset({b"accept", b"traceparent", b"tracestate", b"user-agent", b"baggage"})
FRAMING_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection"})  # set here, not copied
PAUSE_AT_BYTES = 1024 * 1024  # a response buffered beyond this pauses reading until the relay catches up
KEEPALIVE_S = 30.0  # an idle connection older than this is closed rather than reused
MAX_TARGETS_CACHED = 1024


class UpstreamTransportError(Exception):
    """The upstream broke the connection, answered malformed HTTP, or closed before the answer was complete."""


class AnswerTooLarge(UpstreamTransportError):
    """An answer read whole grew past its bound; its connection was closed, not reused."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"answer exceeds {max_bytes} bytes")
        self.max_bytes = max_bytes


class UpstreamConnectError(UpstreamTransportError):
    """No connection could be made (refused, unreachable, unknown host): nothing was sent."""


class UpstreamClosedBeforeAnswer(UpstreamTransportError):
    """The connection ended before any byte of the answer. On a reused connection the upstream let it go while
    idle (its keep-alive timeout) just as the request went out, so sending again on a fresh one is safe."""


class UpstreamReadTimeout(UpstreamTransportError, TimeoutError):
    """Nothing arrived from the upstream for the read timeout."""


class UpstreamConnectTimeout(UpstreamTransportError, TimeoutError):
    """The connection was not established within the connect timeout."""


@contextmanager
def upstream_errors(pool: str) -> Iterator[None]:
    """Translate transport failures into gateway errors, at this one boundary."""
    try:
        yield
    except TimeoutError as error:
        raise UpstreamTimeout(f"Upstream of pool {pool!r} timed out.") from error
    except AnswerTooLarge as error:
        raise UpstreamAnswerTooLarge(
            f"The answer from pool {pool!r} is larger than the gateway holds whole (max_answer_bytes, "
            f"{error.max_bytes} bytes); a streamed request is passed on as it arrives.",
            code="upstream_answer_too_large") from error
    except UpstreamTransportError as error:
        raise UpstreamUnavailable(f"Upstream of pool {pool!r} is unavailable: {type(error).__name__}.") from error


def upstream_headers(inbound: list[tuple[bytes, bytes]], auth: dict[str, str], request_id: str) -> dict[str, str]:
    headers = {name.decode(): value.decode("latin-1") for name, value in inbound if name in FORWARDED_HEADERS}
    headers["content-type"] = "application/json"
    headers["accept-encoding"] = "identity"  # the relay scans and re-labels bodies; it never decompresses
    headers["x-request-id"] = request_id
    return headers | auth


# -- addressing and encoding ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Origin:
    scheme: str
    host: str
    port: int
    host_header: str


@dataclass(frozen=True)
class BaseUrl:
    """A pool's upstream URL: where to connect, and the path its routes hang under (often empty)."""

    origin: Origin
    path: str


def parse_base_url(base_url: str) -> BaseUrl:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or parts.hostname is None:
        raise UpstreamConnectError(f"unsupported upstream URL scheme {parts.scheme!r}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host_header = parts.netloc.rpartition("@")[2]  # never credentials in the Host header
    return BaseUrl(Origin(parts.scheme, parts.hostname, port, host_header), parts.path.rstrip("/"))


def encode_head(method: str, origin: Origin, target: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """The request line and headers; `target` is the path and query (already checked by the proxy)."""
    lines = [f"{method} {target} HTTP/1.1", f"host: {origin.host_header}"]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers.items() if name.lower() not in FRAMING_HEADERS]
    if any("\r" in line or "\n" in line for line in lines):  # a CRLF inside one value would start a new header
        raise UpstreamTransportError("a request header contains a line break")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


# Takes body bytes as they arrive, from the read callback. It returns None once it is done with them, or, when it
# had to stop part-way (the relay's client is not taking bytes as fast), a coroutine that finishes the job: the
# pump's task awaits it, and what arrives meanwhile is buffered (and pauses reading at PAUSE_AT_BYTES).
Sink = Callable[[bytes], Coroutine[Any, Any, None] | None]


# -- one connection -------------------------------------------------------------------------------------


class UpstreamConnection(asyncio.Protocol):
    """One keep-alive connection; httptools calls back into it as packets arrive. One request at a time."""

    def __init__(self, read_timeout_s: float) -> None:
        self.read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._parser = httptools.HttpResponseParser(self)
        self.reusable = False
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self.complete = False
        self.answered = False
        self.error: UpstreamTransportError | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_read = self._wait_since = self.loop.time()
        self._sink: Sink | None = None  # set while `pump` hands the body on from the read callback
        self._pumped_to: Sink | None = None  # the sink `pump` hands the body to (`redirect` changes it)
        self._sink_error: Exception | None = None
        self._sink_rest: Coroutine[Any, Any, None] | None = None  # what a sink left for `pump` to finish
        self._keep_last = False  # `pump(keep_last=True)`: the read that completes the body goes to its caller
        self.on_pause: Callable[[], None] | None = None  # told each time reading pauses for the relay to catch up

    # -- asyncio.Protocol -----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.complete:  # nothing is being asked: an idle connection that speaks is not safe to reuse
            self._fail(UpstreamTransportError("unsolicited data on an idle connection"))
            return
        self.answered = True
        self._last_read = self.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(UpstreamTransportError(f"malformed HTTP from upstream: {error}"))
        sink = self._sink
        if sink is not None:
            body = self._body
            if body:
                # One hand-off per read, not per HTTP chunk in it: under load a read holds many events (one chunk
                # each), and passing them on one by one cost the relay a client write per event. `take` and
                # `_pass_on` inlined (two Python calls fewer per streamed event): while a sink is set, `on_body`
                # neither counts `_buffered` nor pauses, and `pump` set it with nothing buffered, so emptying the
                # list is all of `take` there is to do.
                data = b"".join(body)  # one chunk (the usual read) is returned as it is, not copied
                body.clear()
                try:
                    rest = sink(data)
                except Exception as error:  # raised by `pump`, not into httptools (it would call it malformed HTTP)
                    self._sink_failed(error)
                    return
                if rest is not None:
                    self._sink_waits(rest)

    def eof_received(self) -> bool | None:
        if self.headers_done and not self.complete and self._delimited_by_close():
            self._finish(reusable=False)  # a body without length or chunking ends with the connection
        else:
            self._fail(self._ended("the upstream closed the connection before the answer was complete"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(self._ended(f"connection lost: {type(exc).__name__ if exc else 'closed'}"))

    def _ended(self, message: str) -> UpstreamTransportError:
        return UpstreamTransportError(message) if self.answered else UpstreamClosedBeforeAnswer(message)

    def _delimited_by_close(self) -> bool:
        return "content-length" not in self.headers and "chunked" not in self.headers.get("transfer-encoding", "")

    # -- httptools callbacks --------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._body.append(body)
        if self._sink is not None:
            return  # passed on with the rest of this read, at the end of data_received
        self._buffered += len(body)
        if self._buffered > PAUSE_AT_BYTES and not self._paused:
            self._pause()
        self._wake()

    def on_message_complete(self) -> None:
        if self._keep_last:
            self._sink = None  # this read stays buffered, for `pump` to return (checked once per body, not per read)
        self._finish(self._parser.should_keep_alive())

    def _pass_on(self, sink: Sink, body: bytes) -> None:
        """`pump`'s hand-off of what was buffered (data_received has the same inline, for each read)."""
        try:
            rest = sink(body)
        except Exception as error:  # raised by `pump`, not into httptools (which would call it malformed HTTP)
            self._sink_failed(error)
            return
        if rest is not None:
            self._sink_waits(rest)

    def _sink_failed(self, error: Exception) -> None:
        self._sink, self._sink_error = None, error  # what still arrives is buffered until the caller closes
        self._wake()

    def _sink_waits(self, rest: Coroutine[Any, Any, None]) -> None:
        self._sink, self._sink_rest = None, rest  # buffer what follows until `pump` has finished `rest`
        self._wake()

    # -- the relay's side -----------------------------------------------------------------------------

    def send(self, head: bytes, body: bytes | None) -> None:
        assert self.transport is not None
        self.reusable = False
        self._reset()
        if body:
            self.transport.writelines((head, body))  # no copy of a large body into one buffer
        else:
            self.transport.write(head)

    async def headers_received(self) -> None:
        while not self.headers_done:
            if self.error is not None:
                raise self.error
            await self._wait()

    def take(self) -> bytes:
        """Everything buffered since the last call (b"" when nothing is)."""
        body = self._body
        if not body:
            return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" once the body is complete."""
        while True:
            if self._body:
                return self.take()
            if self.error is not None:
                raise self.error
            if self.complete:
                return b""
            await self._wait()

    async def pump(self, sink: Sink, keep_last: bool = False) -> bytes:
        """Hand every body byte to `sink` inside the read callback, as it arrives, until the body is complete: the
        caller's task sleeps meanwhile instead of waking once per read. When the sink returns a coroutine (it
        must wait), the task awaits it, then passes on what was buffered meanwhile. An error `sink` raises is
        raised here.

        With `keep_last`, the bytes of the read that completes the body are returned instead of handed to `sink`
        (b"" when that read held none): the relay writes them with the end of its own response, one client write
        where there were two (the last event, then the terminating chunk)."""
        self._keep_last = keep_last
        self._pumped_to = sink
        try:
            while True:
                if self._sink_rest is not None:
                    rest, self._sink_rest = self._sink_rest, None
                    await rest
                    continue
                if self._sink_error is not None:
                    raise self._sink_error
                if self._body:  # what arrived before the pump started, or while the sink waited
                    if keep_last and self.complete:
                        return self.take()
                    self._pass_on(self._pumped_to, self.take())
                    continue
                if self.error is not None:
                    raise self.error
                if self.complete:
                    return b""
                self._sink = self._pumped_to
                await self._wait()
                self._sink = None
        finally:
            self._sink = self._pumped_to = None
            self._keep_last = False
            if self._sink_rest is not None:  # cancelled before it was awaited: close it, never leave it pending
                self._sink_rest.close()
                self._sink_rest = None

    def redirect(self, sink: Sink) -> None:
        """From the next read on, `pump` hands the body to `sink` instead (a sink that has seen what it needed
        steps out of the way: one call fewer per read)."""
        if self._pumped_to is not None:
            self._pumped_to = sink
        if self._sink is not None:
            self._sink = sink

    def _pause(self) -> None:
        if self.transport is None:
            return
        self._paused = True
        self.transport.pause_reading()
        if self.on_pause is not None:
            self.on_pause()

    def _resume(self) -> None:
        self._paused = False
        if self.transport is not None:
            self.transport.resume_reading()

    async def _wait(self) -> None:
        waiter = self._waiter = self.loop.create_future()
        if self._timer is None:
            self._wait_since = self.loop.time()
            self._timer = self.loop.call_at(self._wait_since + self.read_timeout_s, self._check_read_timeout)
        await waiter

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _check_read_timeout(self) -> None:
        # One timer per read-timeout period, not one per read: it re-arms itself while data keeps coming.
        # Only time spent waiting counts: a relay held up by a slow client has paused reading itself.
        self._timer = None
        if self.complete or self.error is not None or self._waiter is None:
            return
        due = max(self._last_read, self._wait_since) + self.read_timeout_s
        if self.loop.time() >= due:
            self._fail(UpstreamReadTimeout(f"nothing from upstream for {self.read_timeout_s:g} s"))
        else:
            self._timer = self.loop.call_at(due, self._check_read_timeout)

    def _finish(self, reusable: bool) -> None:
        self.complete = True
        self.reusable = reusable
        self._cancel_timer()
        self._wake()

    def _fail(self, error: UpstreamTransportError) -> None:
        self.reusable = False
        self._cancel_timer()
        if not self.complete and self.error is None:
            self.error = error
        self._wake()
        self.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    @property
    def reading_paused(self) -> bool:
        return self._paused


# -- a response in progress -------------------------------------------------------------------------------


class UpstreamResponse:
    """An upstream answer whose head has arrived; its body is read with `next_chunk` or `read`. Exactly one of
    `release` (after the whole body was read) or `close` ends it and frees its connection slot."""

    def __init__(self, client: UpstreamClient, origin: Origin, connection: UpstreamConnection) -> None:
        self._client = client
        self._origin = origin
        self._connection: UpstreamConnection | None = connection
        self.status = connection.status
        self.headers = connection.headers  # lower-case names; the first of a repeated header

    async def next_chunk(self) -> bytes:
        assert self._connection is not None
        return await self._connection.next_chunk()

    @property
    def on_pause(self) -> Callable[[], None] | None:
        return self._connection.on_pause if self._connection is not None else None

    @on_pause.setter
    def on_pause(self, callback: Callable[[], None] | None) -> None:
        """Called each time the connection stops reading because the body waits for its reader (a slow client)."""
        if self._connection is not None:
            self._connection.on_pause = callback

    @property
    def arrived(self) -> bool:
        """Whether the whole body has arrived from the upstream (read by the caller or not)."""
        return self._connection is not None and self._connection.complete

    @property
    def reading_paused(self) -> bool:
        """Whether the body buffered so far made the connection stop reading from the upstream."""
        return self._connection is not None and self._connection.reading_paused

    async def pump(self, sink: Sink, keep_last: bool = False) -> bytes:
        """The rest of the body, handed to `sink` from the connection's read callback; with `keep_last`, the last
        read's bytes are returned instead (UpstreamConnection.pump)."""
        assert self._connection is not None
        return await self._connection.pump(sink, keep_last)

    def redirect(self, sink: Sink) -> None:
        """Called by the sink `pump` hands reads to: from the next read on, they go to `sink` instead."""
        if self._connection is not None:
            self._connection.redirect(sink)

    async def read(self, max_bytes: int) -> bytes:
        """The rest of the body, whole; past `max_bytes` the connection is closed and AnswerTooLarge raised."""
        parts = []
        size = 0
        while chunk := await self.next_chunk():
            size += len(chunk)
            if size > max_bytes:
                self.close()
                raise AnswerTooLarge(max_bytes)
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._client.give_back(self._origin, connection)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
            self._client.give_back(self._origin, connection)


# -- the pool ---------------------------------------------------------------------------------------------


class Slots:
    """At most `limit` holders at once; waiters are served in order. (asyncio.Semaphore's acquire scans its
    waiters on every call, a measurable cost per request; here a free slot is taken without awaiting.)"""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        if self.used < self.limit and not self._waiters:
            self.used += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # a release hands its slot over by completing this future (`used` is unchanged)
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot arrived as this waiter was cancelled: pass it on
            else:
                with suppress(ValueError):  # a release may already have dropped it
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.used -= 1



class UpstreamClient:
    """Keep-alive connections per upstream origin, at most `connections` requests in flight at once."""

    def __init__(self, connections: int, connect_timeout_s: float, read_timeout_s: float,
                 tls: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_idle_per_origin = connections
        self._slots = Slots(connections)
        self._idle: dict[Origin, list[UpstreamConnection]] = {}
        self._bases: dict[str, BaseUrl] = {}
        self._tls = tls

    async def open(self, method: str, base_url: str, target: str, headers: dict[str, str],
                   body: bytes | None) -> UpstreamResponse:
        """Send one request and wait for the head of its answer."""
        base = self._base(base_url)
        origin = base.origin
        head = encode_head(method, origin, base.path + target, headers, body)
        await self._slots.acquire()
        try:
            idle = self._take_idle(origin)
            if idle is not None:
                try:
                    return await self._exchange(origin, idle, head, body)
                except UpstreamClosedBeforeAnswer:
                    pass  # the upstream let this idle connection go as it was reused; a fresh one is safe
            return await self._exchange(origin, await self._connect(origin), head, body)
        except BaseException:
            self._slots.release()
            raise

    async def _exchange(self, origin: Origin, connection: UpstreamConnection, head: bytes,
                        body: bytes | None) -> UpstreamResponse:
        try:
            connection.send(head, body)
            await connection.headers_received()
        except BaseException:
            connection.close()  # cancelled or failed before the head: the connection's state is unknown
            raise
        return UpstreamResponse(self, origin, connection)

    def give_back(self, origin: Origin, connection: UpstreamConnection) -> None:
        self._slots.release()
        idle = self._idle.setdefault(origin, [])
        if connection.reusable and connection.complete and connection.is_open() \
                and len(idle) < self.max_idle_per_origin:
            connection.idle_since = connection.loop.time()
            idle.append(connection)
        else:
            connection.close()

    def _base(self, base_url: str) -> BaseUrl:
        base = self._bases.get(base_url)
        if base is None:
            if len(self._bases) >= MAX_TARGETS_CACHED:
                self._bases.clear()
            base = self._bases[base_url] = parse_base_url(base_url)
        return base

    def _take_idle(self, origin: Origin) -> UpstreamConnection | None:
        idle = self._idle.get(origin)
        while idle:
            connection = idle.pop()
            if connection.is_open() and connection.loop.time() - connection.idle_since < KEEPALIVE_S:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if origin.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(
                    lambda: UpstreamConnection(self.read_timeout_s), origin.host, origin.port, ssl=tls)
        except TimeoutError as error:
            raise UpstreamConnectTimeout(f"cannot connect to {origin.host_header} in time") from error
        except OSError as error:
            raise UpstreamConnectError(f"cannot connect to {origin.host_header}: {type(error).__name__}") from error
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()


async def open_first_reachable(
    client: UpstreamClient, health: UpstreamHealth, outbound: Outbound
) -> tuple[str, UpstreamResponse]:
    """Open the request on the first candidate that accepts a connection (nothing was sent to the others)."""
    candidates = outbound.candidates
    for upstream in candidates[:-1]:
        with suppress(UpstreamConnectError):
            return upstream, await _open(client, upstream, outbound)
        health.mark_down(upstream)
    last = candidates[-1]
    try:
        return last, await _open(client, last, outbound)
    except UpstreamConnectError:
        health.mark_down(last)
        raise


async def _open(client: UpstreamClient, upstream: str, outbound: Outbound) -> UpstreamResponse:
    return await client.open(outbound.method, upstream, outbound.target, outbound.headers, outbound.body)
