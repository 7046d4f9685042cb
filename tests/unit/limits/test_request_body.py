"""Request bodies through kvgate's server protocol, which reads a body ahead of the app up to
BODY_READ_AHEAD_BYTES (gateway.limits.connections), on a real uvicorn server with the gateway's protocol class, over
loopback: every body reaches the app exactly as the client sent it, however the client's writes split it and with
requests pipelined behind it."""

from __future__ import annotations

import asyncio

from gateway.asgi.io import Receive, Scope, Send
from tests.unit.limits.test_body_writer import GUARD_S, served


async def echo_body(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers each POST with the body it read and the number of messages it came in."""
    assert scope["type"] == "http"
    parts: list[bytes] = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    body = b"".join(parts)
    headers = [(b"content-length", str(len(body)).encode()), (b"x-messages", str(len(parts)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def post(body: bytes, close: bool = False) -> bytes:
    connection = b"connection: close\r\n" if close else b""
    return b"POST /echo HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n%b\r\n%b" % (len(body), connection, body)


async def read_answers(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    answers: list[bytes] = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), GUARD_S)
        assert head.startswith(b"HTTP/1.1 200"), head
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.startswith(b"content-length"))
        answers.append(await asyncio.wait_for(reader.readexactly(length), GUARD_S))
    return answers


def test_bodies_split_across_writes_and_pipelined_reach_the_app_exactly() -> None:
    large = bytes(range(256)) * 2_500  # 640,000 bytes: several socket reads
    small = b'{"model": "m"}'
    empty = b""

    async def scenario() -> list[bytes]:
        async with served(echo_body) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            stream = post(large) + post(small) + post(empty) + post(large[::-1], close=True)
            for start in range(0, len(stream), 7_919):  # writes that cut heads and bodies anywhere
                writer.write(stream[start:start + 7_919])
                await writer.drain()
            answers = await read_answers(reader, 4)
            writer.close()
            return answers

    assert asyncio.run(scenario()) == [large, small, empty, large[::-1]]
