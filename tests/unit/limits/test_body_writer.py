"""The body writer that kvgate's server protocol offers each request (gateway/asgi/body_writer.py), on a real
uvicorn server with the gateway's protocol class, over loopback: what it writes is byte for byte what the
server's `send` writes, and it declines whenever `send` would not simply write."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Counter

from gateway.asgi.body_writer import BodyWriter, body_writer
from gateway.asgi.disconnect import disconnect_notice
from gateway.asgi.io import Message, Receive, Scope, Send
from gateway.limits.connections import ConnectionLimits, guarded_protocol
from gateway.tasks import TaskSupervisor

LIMITS = ConnectionLimits(max_header_bytes=16384, header_timeout_s=30, idle_timeout_s=30, max_connections=16)
GUARD_S = 30.0
START: Message = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def body(data: bytes, more: bool = True) -> Message:
    return {"type": "http.response.body", "body": data, "more_body": more}


@asynccontextmanager
async def served(app: App) -> AsyncIterator[int]:
    """`app` behind uvicorn with the gateway's protocol class on a free loopback port (connections wait in the
    listening socket's backlog until the server accepts them, so no start-up wait is needed)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    closed = Counter("closed", "closes", ["reason"], registry=CollectorRegistry())
    config = uvicorn.Config(app, http=guarded_protocol(LIMITS, closed), ws="none", lifespan="off", log_config=None,
                            access_log=False, proxy_headers=False)
    server = uvicorn.Server(config)
    tasks = TaskSupervisor("body-writer-test")
    serving = tasks.spawn(server.serve(sockets=[listener]), "uvicorn")
    try:
        yield listener.getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, GUARD_S)
        await tasks.close()
        listener.close()


async def exchange(port: int, request: bytes) -> bytes:
    """Everything the server sends for `request` (sent with `connection: close`) until it closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    raw = await asyncio.wait_for(reader.read(), GUARD_S)
    writer.close()
    return raw


def get(path: str, method: str = "GET") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode()


def test_it_writes_exactly_what_send_writes_and_declines_before_the_start_and_after_the_end() -> None:
    results: list[bool] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        write = body_writer(scope)
        assert write is not None
        if scope["path"] == "/sent":
            await send(START)
            await send(body(b"first"))
            await send(body(b""))
            await send(body(b"second"))
            await send(body(b"tail", more=False))
            return
        results.append(write(b"too early"))
        await send(START)
        results.extend([write(b"first"), write(b""), write(b"second")])
        await send(body(b"tail", more=False))
        results.append(write(b"too late"))

    async def main() -> tuple[bytes, bytes]:
        async with served(app) as port:
            return await exchange(port, get("/written")), await exchange(port, get("/sent"))

    written, sent = asyncio.run(main())
    assert results == [False, True, True, True, False]
    assert written == sent
    assert written.endswith(b"\r\n\r\n5\r\nfirst\r\n6\r\nsecond\r\n4\r\ntail\r\n0\r\n\r\n")


def test_it_declines_a_response_with_a_length_and_is_not_offered_for_head() -> None:
    results: list[object] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        write = body_writer(scope)
        if scope["method"] == "HEAD":
            results.append(write)
            await send({**START, "headers": [(b"transfer-encoding", b"chunked")]})
            await send(body(b"", more=False))
            return
        assert write is not None
        await send({**START, "headers": [(b"content-length", b"5")]})
        results.append(write(b"hello"))
        await send(body(b"hello", more=False))

    async def main() -> tuple[bytes, bytes]:
        async with served(app) as port:
            return await exchange(port, get("/")), await exchange(port, get("/", "HEAD"))

    with_length, head = asyncio.run(main())
    assert results == [False, None]
    assert with_length.endswith(b"\r\n\r\nhello")
    assert head.endswith(b"\r\n\r\n")


def test_it_declines_while_the_client_is_not_reading_and_send_then_waits_for_it() -> None:
    chunk = b"x" * (1 << 20)
    declined = asyncio.Event()
    written: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        write = body_writer(scope)
        assert write is not None
        await send(START)
        for number in range(512):  # the client reads nothing: the transport passes its high-water mark long before
            if not write(chunk):
                written.append(number)
                break
        declined.set()
        await send(body(chunk))  # waits until the client reads
        await send(body(b"", more=False))

    async def main() -> bytes:
        async with served(app) as port:
            reader, client = await asyncio.open_connection("127.0.0.1", port, limit=1 << 16)
            client.write(get("/"))
            await asyncio.wait_for(declined.wait(), GUARD_S)
            raw = await asyncio.wait_for(reader.read(), GUARD_S)
            client.close()
            return raw

    raw = asyncio.run(main())
    assert written and written[0] < 512
    payload = dechunk(raw.partition(b"\r\n\r\n")[2])
    assert payload == chunk * (written[0] + 1)


def test_it_declines_once_the_client_has_gone() -> None:
    results: list[bool] = []
    gone = asyncio.Event()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        write = body_writer(scope)
        notice = disconnect_notice(scope)
        assert write is not None and notice is not None
        notice.callback = gone.set
        await send(START)
        results.append(write(b"while connected"))
        await asyncio.wait_for(gone.wait(), GUARD_S)
        results.append(write(b"after the client left"))

    async def main() -> None:
        async with served(app) as port:
            reader, client = await asyncio.open_connection("127.0.0.1", port)
            client.write(get("/"))
            await asyncio.wait_for(reader.readuntil(b"while connected\r\n"), GUARD_S)
            client.close()
            await asyncio.wait_for(gone.wait(), GUARD_S)

    asyncio.run(main())
    assert results == [True, False]


@pytest.mark.parametrize("extensions", [None, {}, {"kvgate.body_writer": None}, {"kvgate.body_writer": {}},
                                        {"kvgate.body_writer": {"write": "not callable"}}])
def test_no_writer_is_found_where_the_server_offers_none(extensions: dict[str, object] | None) -> None:
    scope: Scope = {"type": "http"} if extensions is None else {"type": "http", "extensions": extensions}
    assert body_writer(scope) is None


def test_a_writer_the_server_offers_is_found() -> None:
    def write(data: bytes) -> bool:
        return True

    found: BodyWriter | None = body_writer({"type": "http", "extensions": {"kvgate.body_writer": {"write": write}}})
    assert found is write


def dechunk(data: bytes) -> bytes:
    out: list[bytes] = []
    while True:
        size_line, _, rest = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return b"".join(out)
        out.append(rest[:size])
        data = rest[size + 2:]
