"""The simulator as a raw ASGI application: vLLM's API-key check, exact-path routing, and a lifespan that
owns the KV-event publisher's background work.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.sim.asgi import JSON, HttpRequest, Receive, Scope, Send, send_bytes, send_json
from gateway.sim.auth import UNAUTHORIZED_BODY, ApiKeyGuard
from gateway.sim.config import SimConfig
from gateway.sim.errors import route_error
from gateway.sim.recorder import RequestRecord
from gateway.sim.routes import ROUTES, Handler
from gateway.sim.state import SimState

logger = logging.getLogger("gateway.sim")
SEAM_PREFIX = "/sim/"


class SimApp:
    """One simulated vLLM server (ASGI 3)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.state = SimState.build(config)
        self.publisher = self.state.publisher
        self.guard = ApiKeyGuard(config.api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(HttpRequest.from_scope(scope, receive), send)
        elif scope["type"] == "lifespan":
            await self._lifespan(receive, send)

    async def _http(self, request: HttpRequest, send: Send) -> None:
        record = self.state.recorder.start(request, keep=not request.path.startswith(SEAM_PREFIX))
        if self.guard.guards(request.method, request.path) and not self.guard.accepts(
            request.headers.get("authorization")
        ):
            await send_bytes(send, 401, UNAUTHORIZED_BODY, JSON)
            record.finish(401)
            return
        handler = self._route(request)
        if handler is None:
            await self._route_error(request, send, record)
            return
        await handler(self.state, request, send, record)

    def _route(self, request: HttpRequest) -> Handler | None:
        return ROUTES.get(request.path, {}).get(request.method)

    async def _route_error(self, request: HttpRequest, send: Send, record: RequestRecord) -> None:
        error = route_error(405 if request.path in ROUTES else 404)
        await send_json(send, error.status, error.body)
        record.finish(error.status)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        await receive()
        try:
            if self.publisher is not None:
                self.publisher.open()
        except Exception as exc:
            logger.error("KV event publisher failed to start: %s", exc)
            await send({"type": "lifespan.startup.failed", "message": str(exc)})
            return
        async with asyncio.TaskGroup() as group:
            if self.publisher is not None:
                group.create_task(self.publisher.run())
            await send({"type": "lifespan.startup.complete"})
            await receive()
            if self.publisher is not None:
                self.publisher.stop()
        await send({"type": "lifespan.shutdown.complete"})


def create_sim_app(config: SimConfig) -> SimApp:
    """The ASGI app of one simulated vLLM server."""
    return SimApp(config)
