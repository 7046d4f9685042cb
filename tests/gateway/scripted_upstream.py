"""Small scripted HTTP/1.1 servers on loopback for the upstream-client tests (relay and shadow): each request on
each connection is answered by a script, and the server records connections and requests."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

OK_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

# What a scripted server does with the n-th request (0-based) on the c-th connection (0-based).
Script = Callable[[int, int, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class ScriptedServer:
    script: Script
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection, self.connections = self.connections, self.connections + 1
        try:
            for index in range(100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                self.requests.append(head + await reader.readexactly(length))
                await self.script(connection, index, writer)
                if writer.is_closing():
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


async def serve(script: Script, client_calls: Callable[[str, ScriptedServer], Awaitable[None]],
                tls: ssl.SSLContext | None = None) -> None:
    scripted = ScriptedServer(script)
    server = await asyncio.start_server(scripted.handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    try:
        await client_calls(f"{'https' if tls else 'http'}://127.0.0.1:{port}/v1/completions", scripted)
    finally:
        server.close()
        await server.wait_closed()


async def answer_ok(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
    writer.write(OK_HEAD)
    await writer.drain()




async def drop_second_request(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
    """Answers every request but the second on the first connection, which it closes unanswered."""
    if connection == 0 and index == 1:
        writer.close()  # as if its keep-alive timer fired just as the request arrived
        return
    await answer_ok(connection, index, writer)
