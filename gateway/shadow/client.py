"""The shadow's HTTP client: the relay's pooled client (`gateway.proxy.upstream`), read whole and timed.

There is one HTTP/1.1 client protocol in kvgate; the shadow uses it through an `UpstreamClient` of its own, so
its keep-alive pool and its connection slots are separate from the relay's and a primary never waits for a
slot a shadow holds. A shadow answer is read only to be timed and compared, never relayed: its body goes to a
collector that the connection calls from its read callback (`UpstreamResponse.pump`), one append per socket
read with no task wake-up, and the moment the first event with generated content completes is noted there,
as the bytes are parsed. Connect timeout, TLS, keep-alive reuse and the one retry of a stale idle connection
are the relay client's; its errors are `UpstreamTransportError`s, which the runner counts as shadow errors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.proxy.record import SHADOW_REPLY_MAX_BYTES
from gateway.proxy.sse import StreamWatch
from gateway.proxy.upstream import AnswerTooLarge, UpstreamClient


@dataclass(frozen=True)
class ShadowAnswer:
    status: int
    body: bytes
    first_content_at: float | None  # perf_counter when the first event with generated content completed


class AnswerCollector:
    """A pump sink: keeps the whole body and notes when its first generated content arrived."""

    def __init__(self, watch_content: bool, max_bytes: int) -> None:
        self.parts: list[bytes] = []
        self.size = 0
        self.max_bytes = max_bytes
        self.first_content_at: float | None = None
        self._watch = StreamWatch(strip_usage=False) if watch_content else None  # dropped once content is seen

    def take(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size > self.max_bytes:
            raise AnswerTooLarge(self.max_bytes)  # ShadowClient.post then closes the connection
        self.parts.append(chunk)
        watch = self._watch
        if watch is not None and watch.feed(chunk)[1]:
            self.first_content_at = time.perf_counter()
            self._watch = None

    def body(self) -> bytes:
        return b"".join(self.parts)


class ShadowClient:
    """`post` sends one request on the shadow's own `UpstreamClient` and returns the complete answer."""

    def __init__(self, upstream: UpstreamClient, max_body_bytes: int = SHADOW_REPLY_MAX_BYTES) -> None:
        self.upstream = upstream
        self.max_body_bytes = max_body_bytes

    async def post(self, base_url: str, target: str, headers: dict[str, str], body: bytes,
                   watch_content: bool) -> ShadowAnswer:
        """POST `body` to `target` (path and query) under the pool URL `base_url`."""
        response = await self.upstream.open("POST", base_url, target, headers, body)
        collector = AnswerCollector(watch_content, self.max_body_bytes)
        try:
            await response.pump(collector.take)
        except BaseException:
            response.close()  # failed, too large or abandoned mid-answer: the connection's state is unknown
            raise
        response.release()
        return ShadowAnswer(response.status, collector.body(), collector.first_content_at)

    def close(self) -> None:
        self.upstream.close()
