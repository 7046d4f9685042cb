"""Upstream HTTP: one pooled aiohttp session, pool/upstream choice, and one place that maps errors.

aiohttp is used instead of plain httpx because its C HTTP parser costs about a quarter of the CPU per
streamed response (measured: loadtests/proxy_overhead.py; reference figures in docs/proxy-costs.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from gateway.errors import UpstreamTimeout, UpstreamUnavailable
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Outbound

# Inbound headers that may travel upstream; everything else (keys, hop-by-hop headers, vLLM steering
# headers such as X-data-parallel-rank, X-Vllm-Priority, X-Session-ID) is dropped.
FORWARDED_HEADERS = frozenset({b"accept", b"traceparent", b"tracestate", b"user-agent", b"baggage"})


@contextmanager
def upstream_errors(pool: str) -> Iterator[None]:
    """Translate client-library failures into gateway errors, at this one boundary."""
    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as error:
        raise UpstreamTimeout(f"Upstream of pool {pool!r} timed out.") from error
    except aiohttp.ClientError as error:
        raise UpstreamUnavailable(f"Upstream of pool {pool!r} is unavailable: {type(error).__name__}.") from error


def new_session(connections: int, connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False, skip_auto_headers=("User-Agent",)
    )


def upstream_headers(inbound: list[tuple[bytes, bytes]], auth: dict[str, str], request_id: str) -> dict[str, str]:
    headers = {name.decode(): value.decode("latin-1") for name, value in inbound if name in FORWARDED_HEADERS}
    headers["content-type"] = "application/json"
    headers["accept-encoding"] = "identity"  # the relay scans and re-labels bodies; it never decompresses
    headers["x-request-id"] = request_id
    return headers | auth


async def open_upstream(
    session: aiohttp.ClientSession, method: str, url: str, headers: dict[str, str], body: bytes | None
) -> aiohttp.ClientResponse:
    return await session.request(method, url, headers=headers, data=body, allow_redirects=False)


async def open_first_reachable(
    session: aiohttp.ClientSession, health: UpstreamHealth, outbound: Outbound
) -> tuple[str, aiohttp.ClientResponse]:
    """Open the request on the first candidate that accepts a connection (nothing was sent to the others)."""
    candidates, method, target = outbound.candidates, outbound.method, outbound.target
    headers, body = outbound.headers, outbound.body
    for upstream in candidates[:-1]:
        try:
            return upstream, await open_upstream(session, method, upstream + target, headers, body)
        except aiohttp.ClientConnectorError:
            health.mark_down(upstream)
    last = candidates[-1]
    try:
        return last, await open_upstream(session, method, last + target, headers, body)
    except aiohttp.ClientConnectorError:
        health.mark_down(last)
        raise
