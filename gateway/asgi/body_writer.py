"""Write a streamed response's body to the client's connection without an ASGI message per write.

A streamed answer of 64 events cost about 5,000 instructions per event more through the server's `send`
coroutine (a message dict, a coroutine, uvicorn's checks) than the bytes themselves needed: 14 % of a 64-token
request (loadtests/instructions.py, docs/proxy-costs.md). Under `kvgate serve` the server's protocol
(gateway/limits/connections.py) puts a `BodyWriter` in each request's scope. It writes one body chunk exactly as
the server's own `send` would (the same framing, on the same transport) when that `send` would write at once,
and declines (returns False) in every other case: the response has not started or has ended, it is not chunked,
the client is gone, or the connection is over its write high-water mark. The caller then sends the ASGI message
as before, so waiting for a slow client, a disconnect and every error stay the server's. Under any other ASGI
server there is no writer, and every body goes through `send`.

A middleware between the server and the app that changes body messages must remove the extension from the scope
(kvgate's own stack has none).
"""

from __future__ import annotations

from typing import Protocol

from gateway.asgi.io import Scope, scope_extension

BODY_WRITER_EXTENSION = "kvgate.body_writer"


class BodyWriter(Protocol):
    def __call__(self, body: bytes) -> bool:
        """Write `body` (not empty) as the next part of the response, more to follow; False when it was not
        written and must go through the server's `send`."""


def body_writer(scope: Scope) -> BodyWriter | None:
    writer = scope_extension(scope, BODY_WRITER_EXTENSION, "write")
    return writer if callable(writer) else None
