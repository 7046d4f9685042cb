"""Watch an SSE byte stream as it passes: first generated content, and the usage event.

Bytes are scanned, not parsed: only the one event that carries usage is decoded. When the gateway
asked upstream for usage the client did not want, that event is cut out of the stream.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec

EVENT_END = b"\n\n"
# A text/content/delta string with at least one character, a reasoning string, or a tool call.
CONTENT_EVENT = re.compile(rb'"(?:text|content|delta|reasoning_content|reasoning)":"[^"]|"tool_calls":\[\{')
USAGE_MARK = b'"usage":{'
FINAL_USAGE_MARKS = (b'"choices":[]', b'"response.completed"')


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def usage_from_body(body: dict[str, Any]) -> Usage | None:
    """Usage of a chat/completions body, a usage chunk, or a Responses-API object."""
    usage = body.get("usage")
    if not isinstance(usage, dict) and isinstance(body.get("response"), dict):
        usage = body["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens", usage.get("input_tokens"))),
        cached_tokens=_int(details.get("cached_tokens") if isinstance(details, dict) else None),
        completion_tokens=_int(usage.get("completion_tokens", usage.get("output_tokens"))),
    )


def usage_from_json(body: bytes) -> Usage | None:
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError:
        return None
    return usage_from_body(parsed) if isinstance(parsed, dict) else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class StreamWatch:
    """Feed it upstream chunks in order; it returns the bytes to pass on to the client."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.content_seen = False
        self.usage: Usage | None = None
        self._tail = b""  # bytes of an event that is not complete yet

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """(bytes to forward, whether this chunk carried the first generated content)."""
        region = self._tail + chunk if self._tail else chunk
        end = region.rfind(EVENT_END)
        cut = end + len(EVENT_END) if end >= 0 else 0
        complete, self._tail = region[:cut], region[cut:]
        first = not self.content_seen and CONTENT_EVENT.search(region) is not None
        self.content_seen = self.content_seen or first
        if USAGE_MARK in complete:
            complete = self._take_usage(complete)
        forward = complete if self.strip_usage else chunk
        return forward, first

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (a final event without its blank line)."""
        rest, self._tail = self._tail, b""
        return rest if self.strip_usage else b""

    def _take_usage(self, complete: bytes) -> bytes:
        kept = []
        for event in complete.split(EVENT_END)[:-1]:
            if USAGE_MARK in event and any(mark in event for mark in FINAL_USAGE_MARKS):
                self.usage = _event_usage(event) or self.usage
                if self.strip_usage and b'"choices":[]' in event:
                    continue
            kept.append(event + EVENT_END)
        return b"".join(kept)


def stream_usage(stream: bytes) -> Usage | None:
    """Usage of a whole SSE stream: its last event that carries usage (the final one when usage is continuous)."""
    mark = stream.rfind(USAGE_MARK)
    if mark < 0:
        return None
    start = stream.rfind(EVENT_END, 0, mark)
    end = stream.find(EVENT_END, mark)
    return _event_usage(stream[start + len(EVENT_END) if start >= 0 else 0 : end if end >= 0 else len(stream)])


def _event_usage(event: bytes) -> Usage | None:
    data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
    try:
        parsed = msgspec.json.decode(data)
    except msgspec.DecodeError:
        return None
    return usage_from_body(parsed) if isinstance(parsed, dict) else None
