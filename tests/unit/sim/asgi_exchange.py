"""The server side of one ASGI HTTP exchange, played by the test (what uvicorn does for the simulator's app):
deliver the request body, collect what the app sends, and disconnect the client when the test says so."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from gateway.sim.app import SimApp
from gateway.sim.asgi import Message


class Exchange:
    def __init__(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
                 query: str = "") -> None:
        self.scope: dict[str, Any] = {
            "type": "http", "method": method, "path": path, "query_string": query.encode(),
            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()],
        }
        self.body = body
        self.sent: list[Message] = []
        self.client_gone = asyncio.Event()
        self._delivered = False

    async def receive(self) -> Message:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.client_gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        status: int = self.sent[0]["status"]
        return status

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def content(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")

    @property
    def complete(self) -> bool:
        return bool(self.sent) and self.sent[-1]["type"] == "http.response.body" and not self.sent[-1].get(
            "more_body", False)

    def json(self) -> Any:
        return json.loads(self.content)


async def call(app: SimApp, method: str, path: str, payload: Any = None, headers: dict[str, str] | None = None,
               query: str = "", raw: bytes | None = None) -> Exchange:
    """One request to `app` (a JSON body unless `raw` is given); returns once the app has answered."""
    body = raw if raw is not None else (b"" if payload is None else json.dumps(payload).encode())
    sent_headers = {"content-type": "application/json"} if payload is not None else {}
    exchange = Exchange(method, path, body, {**sent_headers, **(headers or {})}, query)
    await app(exchange.scope, exchange.receive, exchange.send)
    return exchange


async def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll `condition` with a deadline that only bounds the wait."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)
