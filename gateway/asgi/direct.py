"""Writing a streamed response body straight onto the client's connection, one write per upstream read.

Relaying an SSE stream through ASGI costs, per event, a wake-up of the request's task and one `http.response.body`
message through the server's `send`. The server (gateway/limits/connections.py, kvgate's uvicorn protocol) offers
instead, in the request's `scope["extensions"]`, a `DirectBody`: after the response has started through ASGI, body
chunks go onto the transport from the upstream connection's own read callback, framed exactly as uvicorn frames
them, and the response is still ended through ASGI (uvicorn writes the last chunk and finishes its request cycle, so
keep-alive and pipelining are unchanged). Under any other server the extension is absent and the relay uses ASGI.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from gateway.asgi.io import Scope

EXTENSION = "kvgate.direct_body"


class RequestCycle(Protocol):
    """What the writer reads of the server's state for one request (uvicorn's RequestResponseCycle)."""

    chunked_encoding: bool | None
    disconnected: bool
    response_complete: bool


class WriteFlow(Protocol):
    write_paused: bool


class DirectBody:
    """Body chunks of one started, chunked response, written onto the client's transport without ASGI."""

    def __init__(self, transport: asyncio.Transport, cycle: RequestCycle, flow: WriteFlow) -> None:
        self._transport = transport
        self._cycle = cycle
        self._flow = flow

    def usable(self) -> bool:
        """True once the response head went out with chunked framing and while the client is connected; the
        relay checks it after starting the response, and falls back to ASGI messages otherwise."""
        cycle = self._cycle
        return cycle.chunked_encoding is True and not cycle.disconnected and not cycle.response_complete

    def write(self, data: bytes) -> bool:
        """Write one chunk; False when the client's side is full and the caller should wait before the next.

        A client that has gone is not written to (its request task is being cancelled by the disconnect)."""
        if self._cycle.disconnected or self._transport.is_closing():
            return True
        self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return not self._flow.write_paused


def direct_body(scope: Scope) -> DirectBody | None:
    extensions: dict[str, Any] | None = scope.get("extensions")
    found = extensions.get(EXTENSION) if extensions else None
    return found if isinstance(found, DirectBody) else None
