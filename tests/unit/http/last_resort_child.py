"""The last-resort handler: an exception nobody foresaw becomes an OpenAI-shaped 500 with a request id, one
counted `kvgate_internal_errors_total`, and one JSON log line with the error class and the stack.

Every failure a client or a store can cause from outside is answered with its own 4xx/503 (tests/gateway), so
the unforeseen one is planted here: the real gateway application, started through its ASGI lifespan, has its
shared SQLite store closed under it (a store used after close, the kind of ordering bug the handler exists for).
The test plays the ASGI server, as uvicorn would. This module runs in a child interpreter (logging is configured
process-wide, so the parent test process stays untouched); it prints one JSON line with what the app sent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from gateway.http.app import GatewayApp
from gateway.log import configure_logging
from gateway.settings import Settings
from gateway.tasks import TaskSupervisor
from tests.salt_vectors import GATEWAY_SECRET

Message = MutableMapping[str, Any]


class Lifespan:
    """Drives the app's lifespan: start-up, then shutdown when `stop` is called."""

    def __init__(self, app: GatewayApp) -> None:
        self.app = app
        self.sent: list[Message] = []
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._tasks = TaskSupervisor("lifespan-test")

    async def receive(self) -> Message:
        return await self._inbox.get()

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def start(self) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._tasks.spawn(self.app({"type": "lifespan"}, self.receive, self.send),
                                                     "lifespan")
        await self._inbox.put({"type": "lifespan.startup"})
        while not self.sent and not task.done():
            await asyncio.sleep(0.01)  # the start-up message is the observable event; this only yields
        assert self.sent and self.sent[0]["type"] == "lifespan.startup.complete", self.sent
        return task

    async def stop(self, task: asyncio.Task[None]) -> None:
        await self._inbox.put({"type": "lifespan.shutdown"})
        await task


async def get(app: GatewayApp, path: str, key: str) -> list[Message]:
    sent: list[Message] = []
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client never goes away
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"authorization", f"Bearer {key}".encode())], "client": ("127.0.0.1", 50000),
             "server": ("127.0.0.1", 8080), "scheme": "http", "http_version": "1.1"}
    await app(scope, receive, send)
    return sent


async def _shadow_report_after_the_store_closed(app: GatewayApp, admin_key: str) -> list[Message]:
    lifespan = Lifespan(app)
    task = await lifespan.start()
    try:
        await app.state.storage.close()
        sent = await get(app, "/admin/shadow", admin_key)
        counted = app.metrics.registry.get_sample_value("kvgate_internal_errors_total", {"route": "/admin/shadow"})
        assert counted == 1.0
        return sent
    finally:
        await lifespan.stop(task)


def main(argv: list[str]) -> int:
    root, state, admin_key = Path(argv[0]), Path(argv[1]), argv[2]
    settings = Settings(policies=root, salt_secret=SecretStr(GATEWAY_SECRET), state_path=state, reuse_trace=False)
    configure_logging("json", "info")
    sent = asyncio.run(_shadow_report_after_the_store_closed(GatewayApp(settings), admin_key))
    start, body = sent[0], b"".join(message.get("body", b"") for message in sent[1:])
    print(json.dumps({"status": start["status"], "headers": {k.decode(): v.decode() for k, v in start["headers"]},
                      "body": body.decode()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
