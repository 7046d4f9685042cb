"""Response bodies and SSE events of `/v1/completions` and `/v1/chat/completions`, as vLLM 0.25.0 sent them.

Key sets and order follow the captures in `fixtures/vllm-0.25.0/http/`: stream chunks carry no
`kv_transfer_params`; the chat stream opens with a `delta.role` chunk (with `content: ""`); the usage chunk
(`choices: []`, `prompt_tokens_details: {"cached_tokens": N}`, `system_fingerprint`) comes only with
`stream_options.include_usage`; every stream ends with `data: [DONE]`. Non-stream bodies carry
`prompt_tokens_details: {"cached_tokens": N, "multimodal_tokens": null}` and `kv_transfer_params: null`.
Token events are assembled from pre-encoded byte templates to keep the per-token cost low.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

from gateway.sim.errors import error_body
from gateway.sim.protocol import GenRequest, Kind

DONE = b"data: [DONE]\n\n"
SSE_MEDIA_TYPE = "text/event-stream; charset=utf-8"
_encode = msgspec.json.Encoder().encode


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + _encode(payload) + b"\n\n"


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int

    def stream_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }

    def body_dict(self) -> dict[str, Any]:
        usage = self.stream_dict()
        usage["prompt_tokens_details"]["multimodal_tokens"] = None
        return usage


@dataclass(frozen=True)
class ResponseMeta:
    """What every body and chunk of one response repeats."""

    request: GenRequest
    created: int
    fingerprint: str


class StreamFormat(Protocol):
    """The SSE events of one streamed response, in the order they are sent."""

    def opening(self) -> bytes: ...

    def first(self) -> bytes: ...

    def token(self, text: str, last: bool) -> bytes: ...

    def closing(self, usage: Usage, text: str) -> bytes: ...

    def error(self, message: str) -> bytes: ...


class _ChunkStream:
    """Shared parts of the completions and chat streams."""

    object_name = ""

    def __init__(self, meta: ResponseMeta) -> None:
        self.meta = meta
        request = meta.request
        self._header = {"id": request.response_id, "object": self.object_name, "created": meta.created,
                        "model": request.model}
        self._prefix = b"data: " + _encode(self._header)[:-1] + b',"choices":[{"index":0,'

    def opening(self) -> bytes:
        return b""

    def closing(self, usage: Usage, text: str) -> bytes:
        if not self.meta.request.include_usage:
            return DONE
        chunk = {**self._header, "choices": [], "usage": usage.stream_dict(),
                 "system_fingerprint": self.meta.fingerprint}
        return sse(chunk) + DONE

    def error(self, message: str) -> bytes:
        return sse(error_body(500, message)) + DONE


class CompletionStream(_ChunkStream):
    object_name = "text_completion"
    _tail = b',"logprobs":null,"finish_reason":%s,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]}\n\n'

    def first(self) -> bytes:
        return b""

    def token(self, text: str, last: bool) -> bytes:
        return self._prefix + b'"text":' + _encode(text) + self._tail % (b'"length"' if last else b"null")


class ChatStream(_ChunkStream):
    object_name = "chat.completion.chunk"
    _tail = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
    _last_tail = b'},"logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":null}]}\n\n'

    def first(self) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        return sse({**self._header, "choices": [choice], "prompt_token_ids": None, "prompt_text": None})

    def token(self, text: str, last: bool) -> bytes:
        return self._prefix + b'"delta":{"content":' + _encode(text) + (self._last_tail if last else self._tail)


def completion_body(meta: ResponseMeta, text: str, usage: Usage) -> dict[str, Any]:
    request = meta.request
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None,
              "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None}
    return {"id": request.response_id, "object": "text_completion", "created": meta.created,
            "model": request.model, "choices": [choice], "service_tier": None,
            "system_fingerprint": meta.fingerprint, "usage": usage.body_dict(), "kv_transfer_params": None,
            "metrics": None}


def chat_body(meta: ResponseMeta, text: str, usage: Usage) -> dict[str, Any]:
    request = meta.request
    message = {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
               "function_call": None, "reasoning": None}
    choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "length", "stop_reason": None,
              "token_ids": None, "routed_experts": None}
    return {"id": request.response_id, "object": "chat.completion", "created": meta.created,
            "model": request.model, "choices": [choice], "service_tier": None,
            "system_fingerprint": meta.fingerprint, "usage": usage.body_dict(), "prompt_logprobs": None,
            "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None, "metrics": None}


def chunk_stream(meta: ResponseMeta) -> StreamFormat:
    return ChatStream(meta) if meta.request.kind is Kind.CHAT else CompletionStream(meta)


def body_for(meta: ResponseMeta, text: str, usage: Usage) -> dict[str, Any]:
    return chat_body(meta, text, usage) if meta.request.kind is Kind.CHAT else completion_body(meta, text, usage)
