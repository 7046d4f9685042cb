"""One worker of `kvgate serve --workers N`: who it is, and how it reaches the worker that ingests KV events.

Worker 0 is the ingesting worker: it alone runs the ledger's KV-event subscribers and periodic passes and the
isolation canary's schedule, so each event source is read once per host. It also answers on a private Unix
socket (in a directory only the gateway's user can enter); the other workers forward the admin routes whose
answer lives in its memory (the audit with its unflushed batches and clock offsets, the canary with its
summary) there, with the caller's own credentials, so every worker gives the ingesting worker's answer.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.asgi.io import Scope
from gateway.errors import GatewayError
from gateway.log import get_logger
from gateway.routes import Local

log = get_logger(__name__)
INGESTING_WORKER = 0
FORWARDED_HEADERS = frozenset({b"authorization", b"x-api-key", b"content-type"})
FORWARD_TIMEOUT_S = 120.0  # an audit over a large store can take a while; the caller's own timeout still applies
# Routes whose answer depends on the ingesting worker's memory.
INGESTER_ROUTES = frozenset({Local.AUDIT, Local.CANARY})

Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


@dataclass(frozen=True)
class WorkerRole:
    index: int
    count: int
    ingester_socket: Path  # worker 0 answers here too; the others forward INGESTER_ROUTES to it
    replaced: bool = False  # started in place of a worker that exited

    @property
    def ingests(self) -> bool:
        return self.index == INGESTING_WORKER

    @property
    def header(self) -> tuple[bytes, bytes]:
        return b"x-kvgate-worker", str(self.index).encode()

    def reload_everywhere(self) -> None:
        """Ask the supervising parent to pass a reload (SIGHUP) on to every worker."""
        os.kill(os.getppid(), signal.SIGHUP)


class IngesterUnavailable(GatewayError):
    status_code = 503
    error_type = "service_unavailable"


class IngesterClient:
    """Forwards an admin request unchanged (method, path, query, credentials) to the ingesting worker."""

    def __init__(self, socket_path: Path) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(socket_path)),
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S), auto_decompress=False)

    async def forward(self, scope: Scope) -> Answer:
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        query: bytes = scope.get("query_string", b"")
        target = raw_path.decode("latin-1") + (f"?{query.decode('latin-1')}" if query else "")
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                   if name.lower() in FORWARDED_HEADERS}
        try:
            async with self._session.request(scope["method"], f"http://ingester{target}", headers=headers) as reply:
                body = await reply.read()
                content_type = reply.headers.get("content-type", "application/json")
                return reply.status, body, [(b"content-type", content_type.encode("latin-1"))]
        except (aiohttp.ClientError, TimeoutError) as error:
            log.warning("ingester_unreachable", error=repr(error)[:300])
            raise IngesterUnavailable("The worker that keeps the ledger is not answering now; try again.",
                                      code="ingester_unavailable") from None

    async def close(self) -> None:
        await self._session.close()
