"""Build a non-streaming reply from an upstream stream (tenants with `measure_ttft: true`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.proxy.sse import stream_objects


@dataclass
class ChoiceText:
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: object = None


class StreamAssembler:
    """Collects chunk objects of a completions or chat stream into one response object."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> None:
        self._buffer += chunk

    @property
    def size(self) -> int:
        """Bytes held so far."""
        return len(self._buffer)

    def result(self) -> tuple[int, dict[str, Any]]:
        """(HTTP status, body): 200 and the assembled object, or 500 and an upstream error event."""
        chunks = list(stream_objects(bytes(self._buffer)))
        error = next((chunk for chunk in chunks if "error" in chunk), None)
        if error is not None:
            return 500, error
        return 200, self._merge(chunks)

    def _merge(self, chunks: list[dict[str, Any]]) -> dict[str, Any]:
        choices: dict[int, ChoiceText] = {}
        usage: object = None
        for chunk in chunks:
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                _add_choice(choices.setdefault(int(choice.get("index", 0)), ChoiceText()), choice, self.chat)
        head = chunks[0] if chunks else {}
        return {
            "id": head.get("id"),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": head.get("created"),
            "model": head.get("model"),
            "choices": [self._choice(index, text) for index, text in sorted(choices.items())],
            "usage": usage,
        }

    def _choice(self, index: int, text: ChoiceText) -> dict[str, Any]:
        content = "".join(text.parts)
        if self.chat:
            message = {"role": "assistant", "content": content}
            return {"index": index, "message": message, "logprobs": None, "finish_reason": text.finish_reason}
        return {
            "index": index,
            "text": content,
            "logprobs": None,
            "finish_reason": text.finish_reason,
            "stop_reason": text.stop_reason,
        }


def _add_choice(target: ChoiceText, choice: dict[str, Any], chat: bool) -> None:
    piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
    if isinstance(piece, str):
        target.parts.append(piece)
    target.finish_reason = choice.get("finish_reason") or target.finish_reason
    target.stop_reason = choice.get("stop_reason", target.stop_reason)
