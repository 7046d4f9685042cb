"""One streamed completion through the gateway, timed on the client: TTFT, usage and the gateway's headers."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Ask:
    """What to send: a tenant's key, the end user (which picks the arm through the rollout) and the prompt."""

    key: str
    user: str
    prompt: list[int]
    model: str
    max_tokens: int


@dataclass(frozen=True)
class Outcome:
    status: int
    ttft_s: float | None
    total_s: float
    started_at: float
    pool: str | None
    overhead_ms: float | None
    request_id: str | None
    prompt_tokens: int | None
    cached_tokens: int | None
    error: str | None = None


def request_body(ask: Ask) -> dict[str, Any]:
    return {"model": ask.model, "prompt": ask.prompt, "max_tokens": ask.max_tokens, "temperature": 0,
            "user": ask.user, "stream": True, "stream_options": {"include_usage": True}}


async def stream_completion(client: httpx.AsyncClient, base_url: str, ask: Ask) -> Outcome:
    """TTFT = from sending to the first `data:` chunk that carries a choice (as the hand protocol measured).
    `base_url` is the gateway's, or an upstream's for a direct baseline (`ask.key` empty: no key sent)."""
    started_at = time.time()
    started = time.perf_counter()
    headers = {"Authorization": f"Bearer {ask.key}"} if ask.key else {}
    try:
        async with client.stream("POST", f"{base_url}/v1/completions", json=request_body(ask),
                                 headers=headers) as reply:
            reader = _StreamReader(started)
            async for line in reply.aiter_lines():
                if reply.status_code == 200:
                    reader.feed(line)
                else:
                    reader.error = (reader.error or "") + line[:300]
            return reader.outcome(reply, started_at)
    except httpx.HTTPError as error:
        return Outcome(0, None, time.perf_counter() - started, started_at, None, None, None, None, None,
                       error=f"{type(error).__name__}: {error}")


class _StreamReader:
    def __init__(self, started: float) -> None:
        self.started = started
        self.ttft_s: float | None = None
        self.usage: dict[str, Any] = {}
        self.error: str | None = None

    def feed(self, line: str) -> None:
        if not line.startswith("data: {"):
            return
        try:
            chunk = json.loads(line[len("data: "):])
        except ValueError:  # recorded on the request's row; one bad line must not end the whole run
            self.error = "a data line that is not JSON"
            return
        if self.ttft_s is None and chunk.get("choices"):
            self.ttft_s = time.perf_counter() - self.started
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("error"), dict):
            self.error = str(chunk["error"].get("message"))

    def outcome(self, reply: httpx.Response, started_at: float) -> Outcome:
        total = time.perf_counter() - self.started
        details = self.usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        prompt_tokens = self.usage.get("prompt_tokens")
        error = self.error
        if reply.status_code != 200:
            error = f"HTTP {reply.status_code}: {error or ''}"
        return Outcome(
            status=reply.status_code, ttft_s=self.ttft_s, total_s=total, started_at=started_at,
            pool=reply.headers.get("x-kvgate-pool"), overhead_ms=_float(reply.headers.get("x-kvgate-overhead-ms")),
            request_id=reply.headers.get("x-request-id"),
            prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
            cached_tokens=cached if isinstance(cached, int) else None, error=error,
        )


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None
