"""Small raw-ASGI helpers: read a bounded body, send a whole response, wait for a disconnect."""

from __future__ import annotations

from starlette.types import Message as Message
from starlette.types import Receive as Receive
from starlette.types import Scope as Scope
from starlette.types import Send as Send

from gateway.errors import GatewayError, PayloadTooLarge, error_bytes

JSON_TYPE = b"application/json"


class ClientDisconnected(Exception):
    """The client went away before the request body was complete."""


def scope_extension(scope: Scope, name: str, key: str) -> object | None:
    """The value under `key` of the scope's extension `name` (ASGI: one dict per extension); None when absent."""
    extensions = scope.get("extensions")
    extension = extensions.get(name) if extensions else None
    return extension.get(key) if isinstance(extension, dict) else None


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
        if not message.get("more_body", False):
            # A body that came in one message (the usual case, see gateway.limits.connections) is not copied.
            return b"".join([*chunks, chunk]) if chunks else bytes(chunk)
        chunks.append(chunk)


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
