"""A client that stops reading a stream makes a served gateway stop reading it from upstream once 1 MiB waits for
that client (counted in kvgate_client_stalls_total; the gateway's memory stays bounded), and once the client reads
again the whole stream arrives byte for byte, in order."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess

EVENT = b'data: {"choices":[{"index":0,"text":"' + b"t" * 990 + b'"}]}\n\n'
STREAM_BYTES = 64 * 1024 * 1024  # more than loopback buffers between the upstream and the client can hold
DEADLINE_S = 60.0


@dataclass
class StreamingUpstream:
    """An upstream that writes a whole long SSE stream at once."""

    stream: bytes

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"content-length: %d\r\n\r\n" % len(self.stream))
        writer.write(self.stream)
        with suppress(ConnectionError):
            await writer.drain()
        writer.close()


@contextmanager
def streaming_upstream(stream: bytes) -> Iterator[str]:
    upstream = StreamingUpstream(stream)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(upstream.handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def stalls(gateway: ServerProcess, metrics_key: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", headers=bearer(metrics_key)).text
    found = re.search(r'^kvgate_client_stalls_total\{tenant="acme"\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def wait_for_a_stall(gateway: ServerProcess, metrics_key: str) -> float:
    deadline = time.monotonic() + DEADLINE_S
    while (seen := stalls(gateway, metrics_key)) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the counter for the event
    return seen


def response_head(client: socket.socket) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        more = client.recv(4096)
        assert more, "the gateway closed the connection before answering"
        received += more
    return received


def read_chunked_body(client: socket.socket, already: bytes) -> bytes:
    """The de-chunked body of a chunked HTTP/1.1 answer whose head (and maybe some body) is in `already`."""
    head, _, buffer = already.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"transfer-encoding: chunked" in head.lower()
    pieces: list[bytes] = []
    while True:
        while b"\r\n" not in buffer:
            buffer += client.recv(1 << 20)
        size_line, _, buffer = buffer.partition(b"\r\n")
        size = int(size_line, 16)
        while len(buffer) < size + 2:
            more = client.recv(1 << 20)
            assert more, "the connection ended inside a chunk"
            buffer += more
        if size == 0:
            return b"".join(pieces)
        pieces.append(buffer[:size])
        assert buffer[size:size + 2] == b"\r\n"
        buffer = buffer[size + 2:]


def test_a_client_that_stops_reading_stops_the_upstream_read_and_then_gets_the_whole_stream(tmp_path: Path) -> None:
    """Wrong version: a relay that keeps reading from upstream while its client reads nothing: it drains the
    upstream into its own memory and never stalls."""
    stream = EVENT * (STREAM_BYTES // len(EVENT)) + b"data: [DONE]\n\n"
    with streaming_upstream(stream) as url:
        policy = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [url]}}, public_paths=["/livez"])
        key = policy.add_tenant("acme")
        metrics_key = policy.add_tenant("ops", scopes=("metrics",))
        policy.write()
        with run_gateway(policy.root, tmp_path / "gateway.log", new_secret()) as gateway:
            body = b'{"model":"m","prompt":"p","stream":true,"stream_options":{"include_usage":true}}'
            head = (f"POST /v1/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: {bearer(key)['Authorization']}"
                    f"\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode()
            with socket.socket() as client:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                client.connect(("127.0.0.1", gateway.port))
                client.sendall(head + body)
                first = response_head(client)  # the stream has started; nothing more is read until it stalls
                assert wait_for_a_stall(gateway, metrics_key) >= 1, "the relay never waited for the client"
                client.settimeout(DEADLINE_S)
                relayed = read_chunked_body(client, first)
            assert relayed == stream
            assert httpx.get(f"{gateway.url}/livez").status_code == 200
