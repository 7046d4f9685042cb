"""`/v1/responses` bodies and its stream (`event: <type>` + `data: <json>`, no `[DONE]`), OpenAI-shaped.

No capture of this route exists; the shapes follow the OpenAI Responses API as vLLM serves it. Usage reports
`input_tokens_details.cached_tokens`. Every response ends with status "completed".
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.sim.errors import error_body
from gateway.sim.formats import ResponseMeta, Usage

_encode = msgspec.json.Encoder().encode


def _event(kind: str, payload: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + _encode({"type": kind, **payload}) + b"\n\n"


def usage_dict(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _message_id(meta: ResponseMeta) -> str:
    return "msg_" + meta.request.response_id.removeprefix("resp_")


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": None}


def _message(meta: ResponseMeta, text: str | None) -> dict[str, Any]:
    content = [] if text is None else [_part(text)]
    status = "in_progress" if text is None else "completed"
    return {"id": _message_id(meta), "type": "message", "role": "assistant", "status": status, "content": content}


def response_body(meta: ResponseMeta, text: str | None, usage: Usage | None) -> dict[str, Any]:
    """The response object; `text` None means still in progress (no output yet)."""
    request = meta.request
    body = request.body
    return {
        "id": request.response_id, "created_at": meta.created, "incomplete_details": None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"), "model": request.model,
        "object": "response", "output": [] if text is None else [_message(meta, text)],
        "parallel_tool_calls": True, "temperature": request.temperature, "tool_choice": "auto", "tools": [],
        "top_p": body.get("top_p"), "background": False, "max_output_tokens": request.max_tokens,
        "max_tool_calls": None, "previous_response_id": None, "prompt": None, "reasoning": None,
        "service_tier": "auto", "status": "in_progress" if text is None else "completed", "text": None,
        "top_logprobs": None, "truncation": "disabled", "usage": None if usage is None else usage_dict(usage),
        "user": body.get("user"),
    }


class ResponsesStream:
    """The Responses API event stream of one request."""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        self._sequence = 0
        self._where = {"item_id": _message_id(meta), "output_index": 0, "content_index": 0}

    def _next(self, kind: str, payload: dict[str, Any]) -> bytes:
        event = _event(kind, {**payload, "sequence_number": self._sequence})
        self._sequence += 1
        return event

    def opening(self) -> bytes:
        response = response_body(self.meta, None, None)
        return self._next("response.created", {"response": response}) + self._next(
            "response.in_progress", {"response": response}
        )

    def first(self) -> bytes:
        added = self._next("response.output_item.added", {"output_index": 0, "item": _message(self.meta, None)})
        return added + self._next("response.content_part.added", {**self._where, "part": _part("")})

    def token(self, text: str, last: bool) -> bytes:
        return self._next("response.output_text.delta", {**self._where, "delta": text, "logprobs": []})

    def closing(self, usage: Usage, text: str) -> bytes:
        return b"".join((
            self._next("response.output_text.done", {**self._where, "text": text, "logprobs": []}),
            self._next("response.content_part.done", {**self._where, "part": _part(text)}),
            self._next("response.output_item.done", {"output_index": 0, "item": _message(self.meta, text)}),
            self._next("response.completed", {"response": response_body(self.meta, text, usage)}),
        ))

    def error(self, message: str) -> bytes:
        return self._next("error", error_body(500, message))
