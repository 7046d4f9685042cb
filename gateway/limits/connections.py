"""Connection limits enforced inside uvicorn's httptools protocol, before the app (and any key check) runs.

uvicorn with httptools bounds neither the request head nor the time a client may take to send it, and it
keeps any number of connections open. This protocol subclass adds, per connection:

* a byte bound on the request line plus headers (431, connection closed) — counted as bytes arrive, so a
  client can never make the gateway buffer more than the bound plus one socket read;
* a deadline from the first byte of a request to the end of its headers (408, connection closed);
* an idle deadline while no request is in progress (fresh connections and kept-alive ones are closed);
* a cap on open connections (503 and close for the connection over the cap).

Every close it makes is counted in `kvgate_connections_closed_total{reason}`. The subclass relies on
uvicorn's HttpToolsProtocol attributes (`cycle`, `parser`, `timeout_keep_alive_task`, ...), so uvicorn is
pinned to a minor range in pyproject.toml and tests/gateway/test_connection_limits.py covers each behaviour.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import httptools
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.asgi.body_writer import BODY_WRITER_EXTENSION
from gateway.asgi.disconnect import DISCONNECT_EXTENSION, DisconnectNotice
from gateway.errors import openai_error_body

HEADER_OVERHEAD = 4  # ": " and CRLF around each header line
# Request-body bytes a connection may buffer before it stops reading the socket. uvicorn stops at 64 KiB, so a
# 550 KiB body took a pause/resume round trip through the event loop and the app per 64-256 KiB read (about
# 0.5 ms for a 128k-token prompt); the app reads every body whole anyway, so this only moves the pause point.
BODY_READ_AHEAD_BYTES = 1024 * 1024
# The chunk-size lines `b"%x\r\n"` of bodies shorter than this, made once: the body writer takes an event's line from
# here and joins the three parts with `b"".join`, 100-180 instructions per event (callgrind; of ~2,100 for framing
# and uvloop's write) below formatting `b"%x\r\n%b\r\n" % (len(body), body)` each time. (Concatenation saved about
# half as much; `transport.writelines` nothing: uvloop then builds a write context for three buffers.) 2048 sizes
# (~100 KiB) cover an SSE event and a few coalesced ones; longer bodies are formatted.
SIZE_LINES_BELOW = 2048
CHUNK_SIZE_LINES = tuple(b"%x\r\n" % size for size in range(SIZE_LINES_BELOW))
CRLF = b"\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    max_header_bytes: int
    header_timeout_s: float
    idle_timeout_s: float
    max_connections: int


class HeadTooLarge(Exception):
    """Raised from a parser callback to stop parsing a head that is over the bound (httptools wraps it)."""


def refusal_bytes(status: int, message: str, code: str) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI-shaped body that ends the connection."""
    body = json.dumps(openai_error_body(message, "invalid_request_error", None, code)).encode()
    phrase = HTTPStatus(status).phrase
    head = (f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head bounds, head and idle deadlines and a connection cap."""

    limits: ConnectionLimits
    closed: Counter

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0  # bytes received since the current request began, while its head is incomplete
        self._head_size = 0  # exact size of the current head, from the parser callbacks
        self._head_too_large = False
        self._disconnect = DisconnectNotice()  # in each request's scope: the relay's guard needs no watcher task

    # -- connection ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, "The gateway has too many open connections; retry shortly.", "too_many_connections")
            return
        self._arm_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        self._unset_keepalive_if_required()
        super().connection_lost(exc)
        self._disconnect.connection_lost()

    def data_received(self, data: bytes) -> None:
        # Unlike uvicorn, bytes alone do not reset the idle deadline: only the start of a request does,
        # so a client trickling blank lines cannot hold a connection open.
        if self._head_timer is not None:
            self._head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return  # no upgrades are served; the request itself was answered as plain HTTP
        except httptools.HttpParserError:
            if self._head_too_large:
                self._refuse_large_head()
            else:
                self._refuse(400, "The request is not valid HTTP/1.1.", "malformed")
            return
        if self._head_timer is not None and self._head_bytes > self.limits.max_header_bytes:
            self._refuse_large_head()

    # -- parser callbacks ---------------------------------------------------------------------------

    def on_body(self, body: bytes) -> None:
        paused_before = self.flow.read_paused  # e.g. by a pipelined request: that pause is left alone
        super().on_body(body)
        # uvicorn paused reading past its own 64 KiB mark: keep reading up to BODY_READ_AHEAD_BYTES (bounded per
        # connection) so the app gets a large body in one or two messages, not one per socket read. Pausing
        # before the app asks for the body was tried: a client whose send then blocks needs a wake-up to finish
        # (0.8 ms per 550 KiB body on the shared 2-core box).
        if not paused_before and self.flow.read_paused and len(self.cycle.body) <= BODY_READ_AHEAD_BYTES:
            self.flow.resume_reading()

    def on_response_complete(self) -> None:
        # A body read ahead for a request answered without reading it (401, 413, ...) is not kept until the
        # connection's next request or close. (With a pipelined request waiting, self.cycle is that request's:
        # its body is left alone.)
        cycle = self.cycle
        if cycle is not None and cycle.response_complete and cycle.body:
            cycle.body = bytearray()
        super().on_response_complete()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {DISCONNECT_EXTENSION: {"notice": self._disconnect}}  # ASGI: a dict per extension
        self._unset_keepalive_if_required()
        self._head_bytes = 0
        self._head_size = 0
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_deadline)

    def on_url(self, url: bytes) -> None:
        self._grow_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._grow_head(len(name) + len(value) + HEADER_OVERHEAD)
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()
        cycle = self.cycle  # the new request's, unless uvicorn returned early (an upgrade)
        if cycle is not None and cycle.scope is self.scope and self.scope["method"] != "HEAD":
            self.scope["extensions"][BODY_WRITER_EXTENSION] = {"write": ChunkedBodyWriter(cycle).write}

    def _grow_head(self, size: int) -> None:
        self._head_size += size
        if self._head_size > self.limits.max_header_bytes:
            self._head_too_large = True
            raise HeadTooLarge

    # -- deadlines ----------------------------------------------------------------------------------

    def _arm_idle(self) -> None:
        self._unset_keepalive_if_required()
        self.timeout_keep_alive_task = self.loop.call_later(self.limits.idle_timeout_s, self.timeout_keep_alive_handler)

    def timeout_keep_alive_handler(self) -> None:
        # uvicorn arms this after every response. A response in progress keeps the connection; a request
        # whose body is still trickling in after its answer (a 408 or 413, say) does not.
        self.timeout_keep_alive_task = None
        responding = self.cycle is not None and not self.cycle.response_complete
        if responding or self._head_timer is not None or self.transport.is_closing():
            return
        self.closed.labels("idle_timeout").inc()
        self.transport.close()

    def _head_deadline(self) -> None:
        self._head_timer = None
        self._refuse(408, "The request head did not arrive in time.", "header_timeout")

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    # -- refusals -----------------------------------------------------------------------------------

    def _refuse_large_head(self) -> None:
        message = f"The request line and headers exceed {self.limits.max_header_bytes} bytes."
        self._refuse(431, message, "header_too_large")

    def _refuse(self, status: int, message: str, reason: str) -> None:
        self._cancel_head_timer()
        self.closed.labels(reason).inc()
        if self.transport.is_closing():
            return
        self.transport.write(refusal_bytes(status, message, reason))
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        self._refuse(400, "The request is not valid HTTP/1.1.", "malformed")


class ChunkedBodyWriter:
    """The `BodyWriter` (gateway/asgi/body_writer.py) of one uvicorn request cycle is `write`, a bound method (a
    call through `__call__` costs more per event). It frames and writes a body chunk exactly as the cycle's `send`
    writes a body message with more to follow, whenever that `send` would write at once; otherwise it returns
    False, and the caller sends the message."""

    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    def write(self, body: bytes) -> bool:
        cycle = self._cycle
        # `send` would frame it otherwise (not started: None; a content-length: False), raise (complete), return
        # without writing (disconnected) or wait for the client first (write_paused).
        if cycle.chunked_encoding is not True or cycle.response_complete or cycle.disconnected \
                or cycle.flow.write_paused:
            return False
        if body:  # an empty chunk would be the terminator; `send` writes nothing for it
            size = len(body)
            line = CHUNK_SIZE_LINES[size] if size < SIZE_LINES_BELOW else b"%x\r\n" % size
            cycle.transport.write(b"".join((line, body, CRLF)))
        return True


def guarded_protocol(limits: ConnectionLimits, closed: Counter) -> type[GuardedHttpToolsProtocol]:
    """A protocol class bound to these limits and this counter (uvicorn instantiates it per connection)."""
    return type("GatewayHttpProtocol", (GuardedHttpToolsProtocol,), {"limits": limits, "closed": closed})
