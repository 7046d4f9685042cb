"""What a pair is made of, and the generated text of an arm (for determinism checks). Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import msgspec


@dataclass(frozen=True)
class ArmResult:
    """One arm of a pair: timings from its own upstream send, so gateway work is excluded."""

    request_id: str
    status: int
    ttft_s: float | None
    duration_s: float
    cached_tokens: int | None
    text: str | None


@dataclass(frozen=True)
class PairRecord:
    tenant: str
    request_id: str  # the primary's; the shadow's is the same with "-shadow"
    primary_pool: str
    shadow_pool: str
    ttft_delta_s: float | None  # primary − shadow
    duration_delta_s: float
    cached_delta: int | None
    compared_output: bool
    mismatch: bool
    at: float


def pair_record(tenant: str, pools: tuple[str, str], primary: ArmResult, shadow: ArmResult,
                deterministic: bool, at: float) -> PairRecord:
    both_ttft = primary.ttft_s is not None and shadow.ttft_s is not None
    comparable = deterministic and primary.text is not None and shadow.text is not None
    cached_known = primary.cached_tokens is not None and shadow.cached_tokens is not None
    return PairRecord(
        tenant=tenant, request_id=primary.request_id, primary_pool=pools[0], shadow_pool=pools[1],
        ttft_delta_s=(primary.ttft_s or 0.0) - (shadow.ttft_s or 0.0) if both_ttft else None,
        duration_delta_s=primary.duration_s - shadow.duration_s,
        cached_delta=(primary.cached_tokens or 0) - (shadow.cached_tokens or 0) if cached_known else None,
        compared_output=comparable,
        mismatch=comparable and primary.text != shadow.text,
        at=at,
    )


def generated_text(raw: bytes) -> str | None:
    """The text an arm generated, from an SSE stream or a JSON body; None if it cannot be read."""
    stripped = raw.lstrip()
    if stripped.startswith((b"data:", b"event:")):
        return _stream_text(stripped)
    try:
        body = msgspec.json.decode(stripped)
    except msgspec.DecodeError:
        return None
    return "".join(_body_texts(body)) if isinstance(body, dict) else None


# The string values an SSE stream carries generated text in: completions `text`, chat `delta.content`,
# Responses-API `delta`. Matching the escaped JSON strings keeps this to one C-level scan per stream.
STREAM_TEXT = re.compile(rb'"(?:text|content|delta)":"((?:[^"\\]|\\.)*)"')


def _stream_text(raw: bytes) -> str:
    escaped = b"".join(STREAM_TEXT.findall(raw))
    try:
        text = msgspec.json.decode(b'"' + escaped + b'"')
    except msgspec.DecodeError:
        return ""
    return text if isinstance(text, str) else ""


def _body_texts(body: dict[str, Any]) -> list[str]:
    if isinstance(body.get("output_text"), str):
        return [body["output_text"]]
    return [_choice_text(choice) for choice in body.get("choices") or []]


def _choice_text(choice: dict[str, Any]) -> str:
    for holder in (choice, choice.get("delta") or {}, choice.get("message") or {}):
        for key in ("text", "content"):
            if isinstance(holder.get(key), str):
                return str(holder[key])
    return ""
