"""Helpers for the simulator's tests: fixture files, SSE parsing, fresh prompts, polling."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")
REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "sim-model"


def fixtures_dir() -> Path:
    """The vLLM captures in tests/fixtures (override with KVGATE_FIXTURES)."""
    return Path(os.environ.get("KVGATE_FIXTURES", REPO_ROOT / "tests" / "fixtures"))


def capture(relative: str) -> Path:
    return fixtures_dir() / "vllm-0.25.0" / relative


def sse_data(body: str) -> list[Any]:
    """The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`."""
    out: list[Any] = []
    for block in body.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                payload = line[len("data: ") :]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def captured_sse(name: str) -> list[Any]:
    """The events of a captured stream file (status line and headers come first, then a blank line)."""
    text = capture(f"http/{name}").read_text()
    return sse_data(text.split("\n\n", 1)[1])


def captured_responses() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(capture("http/offload_responses.json").read_text())
    return data


def words(count: int, tag: str | None = None) -> str:
    """A fresh prompt of exactly `count` byte tokens."""
    seed = (tag or uuid.uuid4().hex) * (count // 32 + 1)
    return seed[:count]


def poll(condition: Callable[[], T | None], timeout_s: float = 15.0, what: str = "condition") -> T:
    """Return the first truthy value of `condition()`, polling with backoff until `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(delay)  # polling backoff, not synchronisation
        delay = min(delay * 2, 0.2)


def records(base_url: str) -> list[dict[str, Any]]:
    reply = httpx.get(f"{base_url}/sim/requests", timeout=10)
    reply.raise_for_status()
    found: list[dict[str, Any]] = reply.json()["requests"]
    return found


def record_for(base_url: str, request_id: str) -> dict[str, Any] | None:
    return next((r for r in records(base_url) if r["request_id"] == request_id), None)


def complete(base_url: str, prompt: str | list[int], headers: dict[str, str] | None = None,
             **extra: Any) -> dict[str, Any]:
    """A non-streaming completion; asserts 200."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    reply = httpx.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    result: dict[str, Any] = reply.json()
    return result


def cached_tokens(result: dict[str, Any]) -> int:
    value: int = result["usage"]["prompt_tokens_details"]["cached_tokens"]
    return value


def metric_value(base_url: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample of the server's /metrics (0.0 when absent)."""
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    for line in text.splitlines():
        named = line.startswith((name + "{", name + " "))
        if named and all(f'{k}="{v}"' in line for k, v in (labels or {}).items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
