"""The gateway's own small HTTP calls (isolation canary, `/version` probes of the miss path, the upstream
`/metrics` read of `GET /admin/plan`, admin routes forwarded to the ingesting worker): one aiohttp session,
opened on first use.

The relay and the shadow share one httptools client (proxy/upstream.py), so aiohttp serves only these occasional
calls. Imported, it stays resident (about 8 MiB with multidict, yarl, attrs and http.cookies, and some 100 ms
to import; loadtests/reports/idle-memory-2026-12-01/): a gateway whose canary has no schedule, whose tenants
never retry and whose plan is never asked for does not load it at all. The first call imports it in a worker
thread, so the event loop goes on relaying meanwhile instead of stalling for the import.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import aiohttp

SessionFactory = Callable[[], "aiohttp.ClientSession"]
# What one small call reads of an upstream's answer (`/version`, `/v1/models`, a one-token completion, a `/metrics`
# page are all far below it): an upstream that sends more fails the call instead of filling the gateway's memory.
SMALL_ANSWER_MAX_BYTES = 8 * 1024 * 1024


def new_session(connections: int, connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    """A pooled session for the small calls to upstreams (no decompression, no User-Agent of aiohttp's)."""
    import aiohttp

    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
    )


def client_error() -> type[Exception]:
    """The base of what the HTTP client raises when a peer is unreachable or answers badly (timeouts aside).
    Evaluated in `except` clauses, i.e. once a call has raised: aiohttp is loaded by then."""
    import aiohttp

    return aiohttp.ClientError


def total_timeout(seconds: float) -> aiohttp.ClientTimeout:
    """A per-call limit on the whole exchange (for a session's call: aiohttp is loaded by then)."""
    import aiohttp

    return aiohttp.ClientTimeout(total=seconds)


async def read_small(response: aiohttp.ClientResponse, max_bytes: int = SMALL_ANSWER_MAX_BYTES) -> bytes:
    """The whole body of a small call's answer, or aiohttp's ClientPayloadError (a `client_error()`, which every
    caller already handles as a failed call) once it passes `max_bytes`; the connection is then not reused."""
    import aiohttp

    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > max_bytes:
            response.close()
            raise aiohttp.ClientPayloadError(f"answer exceeds {max_bytes} bytes")
    return bytes(body)


class SmallCalls:
    """One session, opened (and aiohttp imported) by the first call that needs it; closed with the gateway."""

    def __init__(self, open_session: SessionFactory) -> None:
        self._open_session = open_session
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def pooled(cls, connections: int, connect_timeout_s: float, read_timeout_s: float) -> SmallCalls:
        return cls(partial(new_session, connections, connect_timeout_s, read_timeout_s))

    @classmethod
    def using(cls, session: aiohttp.ClientSession) -> SmallCalls:
        """Calls through a session the caller opened."""
        return cls(lambda: session)

    @property
    def opened(self) -> bool:
        return self._session is not None

    async def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            await asyncio.to_thread(importlib.import_module, "aiohttp")
            if self._session is None:  # another call may have opened it while this one waited for the import
                self._session = self._open_session()
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
