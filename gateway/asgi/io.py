"""Small raw-ASGI helpers: read a bounded body, send a whole response, wait for a disconnect."""

from __future__ import annotations

from typing import Protocol

from starlette.types import Message as Message
from starlette.types import Receive as Receive
from starlette.types import Scope as Scope
from starlette.types import Send as Send

from gateway.errors import GatewayError, PayloadTooLarge, error_bytes

JSON_TYPE = b"application/json"
CHUNK_WRITER = "kvgate.chunk_writer"  # scope["extensions"] key of the server's direct body writer, where it has one


class ChunkWriter(Protocol):
    """Writes body chunks of a started, chunked response straight to the connection: what an ASGI body message
    with `more_body: True` does, without building and dispatching a message per chunk. The last chunk still goes
    through `send` (more_body False), so the server completes the response itself."""

    def usable(self) -> bool:
        """Whether the response has started, is chunked and is not complete (else use `send`)."""

    def write(self, body: bytes) -> bool:
        """Frame and write one chunk; False when the client has gone (nothing written). Await `drain` while
        `must_drain`."""

    @property
    def must_drain(self) -> bool:
        """The connection's write buffer is over its high-water mark."""

    async def drain(self) -> None:
        """Wait until the connection's write buffer has drained below its low-water mark."""


class ClientDisconnected(Exception):
    """The client went away before the request body was complete."""


def chunk_writer(scope: Scope) -> ChunkWriter | None:
    """The server's direct body writer for this request, or None (then every chunk is an ASGI message)."""
    extensions = scope.get("extensions")
    writer = extensions.get(CHUNK_WRITER) if isinstance(extensions, dict) else None
    return writer if writer is not None and writer.usable() else None


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    declared = header(scope, b"content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"The request body exceeds {limit} bytes.")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def start_message(status: int, headers: list[tuple[bytes, bytes]]) -> Message:
    return {"type": "http.response.start", "status": status, "headers": headers}


async def send_body(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    full = [*headers, (b"content-length", str(len(body)).encode())]
    await send(start_message(status, full))
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, error: GatewayError, headers: list[tuple[bytes, bytes]]) -> None:
    await send_body(send, error.status_code, error_bytes(error), [(b"content-type", JSON_TYPE), *headers])
