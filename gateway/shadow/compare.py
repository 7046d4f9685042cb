"""What a pair is made of, and the generated text of an arm (for determinism checks). Pure."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.proxy.sse import stream_text


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


SSE_STARTS = (b"data:", b"event:", b"id:", b"retry:", b":")  # the fields (or a comment) an SSE stream opens with


def generated_text(raw: bytes) -> str | None:
    """The text an arm generated, from an SSE stream or a JSON body; None if it cannot be read."""
    stripped = raw.lstrip()
    if stripped.startswith(SSE_STARTS):
        return stream_text(stripped)
    try:
        body = msgspec.json.decode(stripped)
    except (msgspec.DecodeError, RecursionError):
        return None
    return "".join(_body_texts(body)) if isinstance(body, dict) else None


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
