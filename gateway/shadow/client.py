"""A lean HTTP/1.1 client for shadow requests: send one POST, collect the whole answer, note its first content.

A shadow answer is read only to be timed and compared, never relayed, so a general client's per-chunk
stream machinery is wasted work. Here each arriving packet costs one parser call (httptools, the parser
uvicorn uses) and a byte append; the coroutine wakes once, when the answer is complete. Measured against
aiohttp on the benchmark's 64-token streams (loadtests/shadow_read.py): 0.38 ms of CPU per answer instead
of 0.80-0.86 ms. Connections are kept alive and reused per origin; TLS upstreams are supported.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from typing import cast
from urllib.parse import urlsplit

import httptools

from gateway.proxy.sse import StreamWatch
from gateway.proxy.upstream import Origin, UpstreamConnectError, UpstreamTransportError, encode_head, parse_base_url

MAX_BODY_BYTES = 64 * 1024 * 1024  # a shadow answer larger than this is abandoned, not buffered
MAX_IDLE_PER_ORIGIN = 64
MAX_TARGETS_CACHED = 1024


class ShadowTransportError(Exception):
    """The shadow upstream could not be reached, broke the connection, or answered malformed HTTP."""


class ClosedBeforeAnswer(ShadowTransportError):
    """The connection ended before a single byte of the answer: on a reused connection, the upstream
    closed it while idle (keep-alive timeout) just as the request went out, so sending again is safe."""


@dataclass(frozen=True)
class Target:
    """Where a URL points: the connection it needs and the request line's target."""

    scheme: str
    host: str
    port: int
    path: str
    host_header: str

    @property
    def origin(self) -> tuple[str, str, int]:
        return self.scheme, self.host, self.port


@dataclass(frozen=True)
class ShadowAnswer:
    status: int
    body: bytes
    first_content_at: float | None  # perf_counter when the first generated content arrived


def parse_target(url: str) -> Target:
    """The relay's URL rules (`gateway.proxy.upstream.parse_base_url`: http/https only, never credentials in the
    Host header), plus the path and query this one request goes to."""
    try:
        origin = parse_base_url(url).origin
    except UpstreamConnectError as error:
        raise ShadowTransportError(str(error)) from None
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Target(origin.scheme, origin.host, origin.port, path, origin.host_header)


def encode_request(target: Target, headers: dict[str, str], body: bytes) -> bytes:
    origin = Origin(target.scheme, target.host, target.port, target.host_header)
    try:
        return encode_head("POST", origin, target.path, headers, body) + body
    except UpstreamTransportError as error:
        raise ShadowTransportError(str(error)) from None


@dataclass
class _Exchange:
    """One request in flight on a connection."""

    done: asyncio.Future[ShadowAnswer]
    watch: StreamWatch | None  # watches for first content until it is seen
    answered: bool = False  # any byte of the answer has arrived
    status: int = 0
    body: bytearray = field(default_factory=bytearray)
    first_content_at: float | None = None


class ShadowConnection(asyncio.Protocol):
    """One keep-alive connection; the parser calls back into it as packets arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reusable = False
        self._parser = httptools.HttpResponseParser(self)
        self._exchange: _Exchange | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self._exchange is not None:
            self._exchange.answered = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as error:
            self._fail(ShadowTransportError(f"malformed HTTP from upstream: {error}"))

    def eof_received(self) -> bool | None:
        self._fail(self._ended("upstream closed the connection before the answer was complete"))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(self._ended(f"connection lost: {type(exc).__name__ if exc else 'closed'}"))

    def _ended(self, message: str) -> ShadowTransportError:
        answered = self._exchange is not None and self._exchange.answered
        return ShadowTransportError(message) if answered else ClosedBeforeAnswer(message)

    # -- httptools callbacks ----------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        if self._exchange is not None:
            self._exchange.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        exchange = self._exchange
        if exchange is None:
            return
        exchange.body += body
        if len(exchange.body) > MAX_BODY_BYTES:
            self._fail(ShadowTransportError("shadow answer exceeds the size limit"))
        elif exchange.watch is not None and exchange.watch.feed(body)[1]:
            exchange.first_content_at = time.perf_counter()
            exchange.watch = None

    def on_message_complete(self) -> None:
        exchange, self._exchange = self._exchange, None
        if exchange is None or exchange.done.done():
            return
        self.reusable = self._parser.should_keep_alive()
        exchange.done.set_result(ShadowAnswer(exchange.status, bytes(exchange.body), exchange.first_content_at))

    # -- use --------------------------------------------------------------------------------------

    def send(self, request: bytes, watch_content: bool) -> asyncio.Future[ShadowAnswer]:
        assert self.transport is not None and self._exchange is None
        self.reusable = False
        done: asyncio.Future[ShadowAnswer] = asyncio.get_running_loop().create_future()
        self._exchange = _Exchange(done, StreamWatch(strip_usage=False) if watch_content else None)
        self.transport.write(request)
        return done

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _fail(self, error: ShadowTransportError) -> None:
        exchange, self._exchange = self._exchange, None
        self.reusable = False
        if exchange is not None and not exchange.done.done():
            exchange.done.set_exception(error)
        self.close()


class ShadowClient:
    """Keep-alive connections per origin; `post` sends one request and returns the complete answer."""

    def __init__(self, connect_timeout_s: float, tls: ssl.SSLContext | None = None) -> None:
        """`tls` verifies https upstreams; by default, against the system's trusted CAs."""
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, str, int], list[ShadowConnection]] = {}
        self._targets: dict[str, Target] = {}
        self._tls = tls

    async def post(self, url: str, headers: dict[str, str], body: bytes, watch_content: bool) -> ShadowAnswer:
        target = self._target(url)
        request = encode_request(target, headers, body)
        idle = self._take_idle(target)
        if idle is not None:
            try:
                return await self._exchange(target, idle, request, watch_content)
            except ClosedBeforeAnswer:
                pass  # the upstream let this idle connection go as we reused it; try a fresh one
        return await self._exchange(target, await self._connect(target), request, watch_content)

    async def _exchange(
        self, target: Target, connection: ShadowConnection, request: bytes, watch_content: bool
    ) -> ShadowAnswer:
        try:
            answer = await connection.send(request, watch_content)
        except BaseException:
            connection.close()  # cancelled or failed mid-answer: the connection's state is unknown
            raise
        self._release(target, connection)
        return answer

    def _target(self, url: str) -> Target:
        target = self._targets.get(url)
        if target is None:
            if len(self._targets) >= MAX_TARGETS_CACHED:
                self._targets.clear()
            target = self._targets[url] = parse_target(url)
        return target

    def _take_idle(self, target: Target) -> ShadowConnection | None:
        idle = self._idle.get(target.origin, [])
        while idle:
            connection = idle.pop()
            if connection.is_open():
                return connection
        return None

    async def _connect(self, target: Target) -> ShadowConnection:
        loop = asyncio.get_running_loop()
        tls = self._tls_context() if target.scheme == "https" else None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, connection = await loop.create_connection(ShadowConnection, target.host, target.port, ssl=tls)
        except (OSError, TimeoutError) as error:
            raise ShadowTransportError(f"cannot connect to {target.host_header}: {type(error).__name__}") from error
        return connection

    def _tls_context(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def _release(self, target: Target, connection: ShadowConnection) -> None:
        idle = self._idle.setdefault(target.origin, [])
        if connection.reusable and connection.is_open() and len(idle) < MAX_IDLE_PER_ORIGIN:
            idle.append(connection)
        else:
            connection.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for connection in idle:
                connection.close()
        self._idle.clear()
