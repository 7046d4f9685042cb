"""An upstream that answers streams in another JSON and SSE style than vLLM's, run as a real process:
`python -m tests.styled_upstream --port P`.

It replays a captured vLLM stream (tests/fixtures) re-serialised the way Python's `json.dumps` writes it (a
space after `:` and `,`, non-ASCII escaped), with keys in reverse order, `\\u0075sage` for the usage key,
CRLF line ends and `data:` without its space, one event per write.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "vllm-0.25.0" / "http"
CAPTURES = {"/v1/chat/completions": "offload_stream_chat.sse.txt",
            "/v1/completions": "offload_stream_completion.sse.txt"}


def reversed_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(item) for item in value]
    return value


def styled_events(capture: str) -> list[bytes]:
    body = (FIXTURES / capture).read_bytes().split(b"\n\n", 1)[1]
    events = []
    for event in body.split(b"\n\n"):
        if not event.strip():
            continue
        data = event[len(b"data: "):]
        if data != b"[DONE]":
            data = json.dumps(reversed_keys(json.loads(data))).replace('"usage"', '"\\u0075sage"').encode()
        events.append(b"data:" + data + b"\r\n\r\n")
    return events


class StyledUpstream:
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body", False):
            pass
        capture = CAPTURES.get(scope["path"])
        if capture is None:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for event in styled_events(capture):
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(StyledUpstream(), host="127.0.0.1", port=args.port, log_level="critical")


if __name__ == "__main__":
    main()
