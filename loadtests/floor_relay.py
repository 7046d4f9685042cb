"""Two bare relays that set the floor under any relay built on kvgate's stack: measured, never shipped.

`python -m loadtests.proxy_overhead --floors` runs both as more proxies on the proxy core, in the same run as
kvgate, nginx and the Rust router. They answer one question the issue's targets raise: what does the cheapest
relay that CPython, uvloop and httptools allow cost per streamed request, before any of kvgate's work?

- `asgi`: uvicorn, configured as `kvgate serve` configures it (uvloop, httptools, no access log), running an
  ASGI app that reads the body, sends it unchanged through kvgate's own upstream client
  (`gateway.proxy.upstream.UpstreamClient`, keep-alive pool) and relays every upstream read as one ASGI message,
  sent from the connection's read callback (`pump` and `run_until_blocked`), as kvgate's relay does. No
  authentication, no rewrite, no metrics, no log line, no disconnect guard, no SSE scan: kvgate's CPU per
  request less this relay's is what kvgate's own features and checks cost on top of the server and the client.
- `protocol`: no ASGI server and no coroutine per request. One `asyncio.Protocol` per client connection and one
  per pooled upstream connection, both parsed by httptools; each upstream read is framed and written onto the
  client's transport from the read callback. This is the in-house server the issue rules out, reduced to its
  least: no timeouts, no backpressure, no error answers, fixed response headers. It shows how close CPython can
  get to a native proxy at all, whatever the design on top.

Both answer `GET /health` for the benchmark's readiness probe. Neither is safe in front of anything real.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from typing import Any, cast

import httptools
import uvicorn
import uvloop

from gateway.asgi.inline import run_until_blocked
from gateway.asgi.io import Message, Receive, Scope, Send
from gateway.proxy.upstream import UpstreamClient, parse_base_url
from gateway.tasks import TaskSupervisor

HEALTH = b"/health"
HEALTH_ANSWER = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: text/plain\r\n\r\nok"
STREAM_HEAD = b"HTTP/1.1 %d OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"
CONNECTIONS = 1024
TIMEOUT_S = 30.0


# -- asgi: uvicorn and kvgate's upstream client, nothing else ------------------------------------------


class AsgiFloor:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._client: UpstreamClient | None = None

    def client(self) -> UpstreamClient:
        if self._client is None:  # made on the serving loop's first request
            self._client = UpstreamClient(CONNECTIONS, TIMEOUT_S, TIMEOUT_S)
        return self._client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = await read_all(receive)
        headers = {"content-type": "application/json"}
        response = await self.client().open(scope["method"], self.upstream, scope["path"], headers, body)
        try:
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await response.pump(lambda chunk: run_until_blocked(
                send({"type": "http.response.body", "body": chunk, "more_body": True})))
            await send({"type": "http.response.body", "body": b""})
        except BaseException:
            response.close()
            raise
        response.release()


async def read_all(receive: Receive) -> bytes:
    parts: list[bytes] = []
    message: Message = {"more_body": True}
    while message.get("more_body", False):
        message = await receive()
        parts.append(message.get("body", b""))
    return b"".join(parts)


def serve_asgi(port: int, upstream: str) -> None:
    config = uvicorn.Config(AsgiFloor(upstream), host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                            ws="none", lifespan="off", access_log=False, log_config=None, log_level="warning",
                            server_header=False, date_header=False, proxy_headers=False)
    uvicorn.Server(config).run()


# -- protocol: callbacks only ------------------------------------------------------------------------


class UpstreamPool:
    def __init__(self, upstream: str) -> None:
        base = parse_base_url(upstream)
        self.host, self.port, self.host_header = base.origin.host, base.origin.port, base.origin.host_header
        self.idle: list[UpstreamSide] = []
        self.connecting = TaskSupervisor("floor-connect")  # a new upstream connection opens in a task


class ClientSide(asyncio.Protocol):
    """One client connection: parses requests, hands each to an upstream connection, writes what comes back."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        if self.url == HEALTH:
            self.transport.write(HEALTH_ANSWER)
            return
        body = b"".join(self.body)
        self.body = []
        head = (b"POST %s HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % (self.url, self.pool.host_header.encode(), len(body)))
        if self.pool.idle:
            self.pool.idle.pop().start(self, head + body)
        else:
            self.pool.connecting.spawn(self._connect(head + body), "connect")

    async def _connect(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: UpstreamSide(self.pool), self.pool.host, self.pool.port)
        upstream.start(self, request)

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)


class UpstreamSide(asyncio.Protocol):
    """One pooled upstream connection: each body read is framed as a chunk and written to the client at once."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: ClientSide | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def start(self, client: ClientSide, request: bytes) -> None:
        assert self.transport is not None
        self.client = client
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_headers_complete(self) -> None:
        assert self.client is not None
        self.client.write(STREAM_HEAD % self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        assert self.client is not None
        self.client.write(b"%x\r\n%s\r\n" % (len(body), body))

    def on_message_complete(self) -> None:
        assert self.client is not None
        self.client.write(LAST_CHUNK)
        self.client = None
        self.pool.idle.append(self)


async def serve_protocol(port: int, upstream: str) -> None:
    pool = UpstreamPool(upstream)
    server = await asyncio.get_running_loop().create_server(lambda: ClientSide(pool), "127.0.0.1", port,
                                                            backlog=CONNECTIONS)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("kind", choices=["asgi", "protocol"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the fast upstream's base URL, e.g. http://127.0.0.1:8000")
    args: Any = parser.parse_args(argv)
    if args.kind == "asgi":
        serve_asgi(args.port, args.upstream)
    else:
        uvloop.run(serve_protocol(args.port, args.upstream))


if __name__ == "__main__":
    main()
