"""Minimal raw-ASGI plumbing for the simulator: requests, replies, streams and client-disconnect races."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import parse_qs

import msgspec
from starlette.types import Message as Message
from starlette.types import Receive as Receive
from starlette.types import Scope as Scope
from starlette.types import Send as Send

Headers = Sequence[tuple[bytes, bytes]]

JSON = "application/json"
_encode = msgspec.json.Encoder().encode


@dataclass
class HttpRequest:
    """One HTTP request: its scope, lower-case headers (the last value of a repeated name wins)."""

    scope: Scope
    receive: Receive
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]

    @classmethod
    def from_scope(cls, scope: Scope, receive: Receive) -> HttpRequest:
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        return cls(scope, receive, scope["method"], scope["path"], query, headers)

    def query_flag(self, name: str) -> bool:
        return self.query.get(name, ["false"])[-1].lower() in {"1", "true", "yes"}

    def with_body(self, raw: bytes) -> HttpRequest:
        """This request with `raw` as its (already read) body, so another handler can read it again."""
        pending = [raw]

        async def receive() -> Message:
            if pending:
                return {"type": "http.request", "body": pending.pop(), "more_body": False}
            return await self.receive()

        return replace(self, receive=receive)

    async def body(self) -> bytes:
        """The whole request body (empty when the client went away before sending it)."""
        chunks: list[bytes] = []
        while True:
            message = await self.receive()
            if message["type"] != "http.request":
                return b""
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)


def header_list(content_type: str | None, extra: Headers = ()) -> list[tuple[bytes, bytes]]:
    headers = [] if content_type is None else [(b"content-type", content_type.encode())]
    return [*headers, *extra]


async def send_bytes(send: Send, status: int, body: bytes, content_type: str | None, extra: Headers = ()) -> None:
    headers = [*header_list(content_type, extra), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_json(send: Send, status: int, payload: object, extra: Headers = ()) -> None:
    await send_bytes(send, status, _encode(payload), JSON, extra)


def encode_json(payload: object) -> bytes:
    return _encode(payload)


class StreamWriter:
    """A chunked response written piece by piece; `complete` is True once its last byte is sent."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.complete = False

    async def start(self, status: int, content_type: str, extra: Headers = ()) -> None:
        await self._send({"type": "http.response.start", "status": status,
                          "headers": header_list(content_type, extra)})
        self.started = True

    async def write(self, data: bytes) -> None:
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": False})
        self.complete = True


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has gone away (call only after the body has been read)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_until_disconnect(receive: Receive, work: Coroutine[Any, Any, None]) -> bool:
    """Run `work` until it ends or the client disconnects (then `work` is cancelled); True if it ended."""
    ended = False

    async def worker() -> None:
        nonlocal ended
        await work
        ended = True

    async with asyncio.TaskGroup() as group:
        working = group.create_task(worker())
        watching = group.create_task(wait_for_disconnect(receive))
        working.add_done_callback(lambda _: watching.cancel())
        watching.add_done_callback(lambda _: working.cancel())
    return ended
