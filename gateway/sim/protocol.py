"""Request bodies of the OpenAI routes: validation in vLLM's order and with vLLM's error replies.

vLLM validates in this order, and so does the simulator: JSON syntax, `cache_salt` (a "before" model
validator), field types (`kv_transfer_params` must be an object, ...), `stream_options` only with
`stream: true`, then the model name (404), then engine-side checks (vocabulary, context length).
Unknown body fields are ignored, as with vLLM's `extra="allow"` models.
"""

from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.sim import tokenizer
from gateway.sim.directives import NO_DIRECTIVES, Directives, parse_directives
from gateway.sim.errors import SimError, bad_request, salt_error, unknown_model, validation_error

logger = logging.getLogger("gateway.sim")

SALT_MAX_CHARS = 128
_SALT_FORBIDDEN = ("@", "/", "\\", "\x00")
_CAP_KEYS = ("max_load_tokens", "max_offload_tokens")


class Kind(enum.StrEnum):
    COMPLETION = "completion"
    CHAT = "chat"
    RESPONSES = "responses"


_ID_PREFIX = {Kind.COMPLETION: "cmpl-", Kind.CHAT: "chatcmpl-", Kind.RESPONSES: "resp_"}


@dataclass(frozen=True)
class TransferCaps:
    """The OffloadingConnector's per-request caps (vLLM 0.33 rules); None means no cap."""

    max_load_tokens: int | None = None
    max_offload_tokens: int | None = None


@dataclass(frozen=True)
class GenRequest:
    """One validated generation request."""

    kind: Kind
    response_id: str
    model: str
    prompt: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    temperature: float | None
    seed: int | None
    cache_salt: str | None
    caps: TransferCaps
    directives: Directives
    body: dict[str, Any]

    @property
    def deterministic(self) -> bool:
        """Greedy (temperature 0) or seeded: the output is a function of the prompt (and seed)."""
        return self.temperature == 0 or self.seed is not None


@dataclass(frozen=True)
class ParseContext:
    """What parsing needs from the server: its model, limits and the request's base id."""

    model: str
    max_model_len: int
    max_tokens_default: int
    base_id: str
    offload: bool


def decode_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or vLLM's 400 for malformed JSON / a non-object body."""
    try:
        value = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        raise _json_error(raw) from None
    if not isinstance(value, dict):
        raise validation_error(("body",), "model_attributes_type", "Input should be a valid dictionary")
    return value


def _json_error(raw: bytes) -> SimError:
    try:
        json.loads(raw)
        position = 0
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        position = exc.pos if isinstance(exc, json.JSONDecodeError) else exc.start
    return validation_error(("body", position), "json_invalid", "JSON decode error")


def check_cache_salt(body: dict[str, Any]) -> str | None:
    """vLLM's `validate_cache_salt`: None, or a non-empty string of at most 128 chars without @ / \\ NUL."""
    salt = body.get("cache_salt")
    if salt is None:
        return None
    if not isinstance(salt, str) or not salt:
        raise salt_error("Parameter 'cache_salt' must be a non-empty string if provided.")
    if len(salt) > SALT_MAX_CHARS or any(ch in salt for ch in _SALT_FORBIDDEN):
        raise salt_error(
            "Parameter 'cache_salt' must be at most 128 characters and must not contain "
            "'@', '/', '\\', or NUL."
        )
    return salt


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_TYPE_CHECKS: dict[str, tuple[Callable[[object], bool], str, str]] = {
    "kv_transfer_params": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "stream": (lambda v: isinstance(v, bool), "bool_type", "Input should be a valid boolean"),
    "stream_options": (lambda v: isinstance(v, dict), "dict_type", "Input should be a valid dictionary"),
    "model": (lambda v: isinstance(v, str), "string_type", "Input should be a valid string"),
    "temperature": (_is_number, "float_type", "Input should be a valid number"),
    "seed": (_is_int, "int_type", "Input should be a valid integer"),
    "n": (_is_int, "int_type", "Input should be a valid integer"),
    "max_tokens": (_is_int, "int_type", "Input should be a valid integer"),
    "max_completion_tokens": (_is_int, "int_type", "Input should be a valid integer"),
    "max_output_tokens": (_is_int, "int_type", "Input should be a valid integer"),
}


def check_field_types(body: dict[str, Any]) -> None:
    """Pydantic-style type errors for the fields the simulator reads (null is always allowed)."""
    for key, (accepts, kind, msg) in _TYPE_CHECKS.items():
        value = body.get(key)
        if value is not None and not accepts(value):
            raise validation_error(("body", key), kind, msg)


def check_stream_options(body: dict[str, Any]) -> None:
    if body.get("stream_options") is not None and not body.get("stream"):
        raise validation_error(
            ("body",), "value_error", "Value error, Stream options can only be defined when `stream=True`."
        )


def check_model(body: dict[str, Any], served: str) -> str:
    name = body.get("model")
    if name is not None and name != served:
        raise unknown_model(name)
    return served


def transfer_caps(body: dict[str, Any], offload: bool) -> TransferCaps:
    """Read the OffloadingConnector caps; an invalid value is logged and ignored, as vLLM 0.33 does."""
    params = body.get("kv_transfer_params")
    if params is None:
        return TransferCaps()
    if not offload:
        logger.debug("Got kv_transfer_params, but no KVConnector found")
        return TransferCaps()
    return TransferCaps(*(_cap(params, key) for key in _CAP_KEYS))


def _cap(params: dict[str, Any], key: str) -> int | None:
    if key not in params:
        return None
    raw = params[key]
    if type(raw) is int and raw >= 0:
        return raw
    logger.warning("%s must be a non-negative int, got %r; ignoring", key, raw)
    return None


def completion_prompt(body: dict[str, Any]) -> tuple[list[int], str]:
    """Tokens of a completions `prompt` (text or token ids) and the text that may carry directives."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), prompt
    if isinstance(prompt, list) and all(_is_int(t) for t in prompt):
        return list(prompt), ""
    if isinstance(prompt, list) and prompt:
        raise bad_request("The simulator serves one prompt per request.", "prompt")
    raise validation_error(("body", "prompt"), "missing" if prompt is None else "string_type",
                           "Field required" if prompt is None else "Input should be a valid string")


def message_text(content: object) -> str:
    """The text of a message's content: a string, null, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(_is_text_part(p) for p in content):
        return "".join(str(p["text"]) for p in content)
    raise bad_request("The simulator accepts only text content.", "messages")


def _is_text_part(part: object) -> bool:
    return isinstance(part, dict) and part.get("type") in {"text", "input_text", "output_text"} and (
        isinstance(part.get("text"), str)
    )


def chat_messages(messages: object, loc: str = "messages") -> list[tuple[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise validation_error(("body", loc), "list_type", "Input should be a valid non-empty list")
    pairs: list[tuple[str, str]] = []
    for item in messages:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise validation_error(("body", loc), "model_type", "Each message needs a string role")
        pairs.append((item["role"], message_text(item.get("content"))))
    return pairs


def last_user_text(pairs: list[tuple[str, str]]) -> str:
    for role, text in reversed(pairs):
        if role == "user":
            return text
    return ""


def responses_messages(body: dict[str, Any]) -> list[tuple[str, str]]:
    """The Responses API `input` (and `instructions`) as chat messages."""
    source = body.get("input")
    pairs = [("user", source)] if isinstance(source, str) else chat_messages(source, "input")
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        pairs.insert(0, ("system", instructions))
    return pairs


def prompt_of(kind: Kind, body: dict[str, Any]) -> tuple[list[int], str]:
    if kind is Kind.COMPLETION:
        return completion_prompt(body)
    pairs = chat_messages(body.get("messages")) if kind is Kind.CHAT else responses_messages(body)
    return tokenizer.apply_chat_template(pairs), last_user_text(pairs)


def requested_max_tokens(kind: Kind, body: dict[str, Any]) -> int | None:
    """The requested output length (`max_output_tokens`, or `max_completion_tokens` over `max_tokens`)."""
    keys = ("max_output_tokens",) if kind is Kind.RESPONSES else ("max_completion_tokens", "max_tokens")
    value: int | None = next((body[key] for key in keys if body.get(key) is not None), None)
    if value is not None and value < 1:
        raise bad_request(f"max_tokens must be at least 1, got {value}.", "max_tokens")
    return value


def check_engine_limits(prompt: list[int], max_tokens: int, max_model_len: int) -> None:
    """Engine-side 400s: an empty prompt, an out-of-vocabulary id, and context overflow."""
    if not prompt:
        raise bad_request("The prompt cannot be empty.", "prompt")
    oov = tokenizer.first_out_of_vocab(prompt)
    if oov is not None:
        raise bad_request(f"Token id {oov} is out of vocabulary")
    if len(prompt) + max_tokens > max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{max_tokens} output tokens and your prompt contains {len(prompt)} input tokens, for a total of "
            f"{len(prompt) + max_tokens} tokens. Please reduce the length of the input prompt or the number "
            f"of requested output tokens. (parameter=input_tokens, value={len(prompt)})",
            "input_tokens",
        )


def check_n(body: dict[str, Any]) -> None:
    if body.get("n") not in (None, 1):
        raise bad_request("The simulator generates one choice per request (n=1).", "n")


def validate_body(body: dict[str, Any], served: str) -> tuple[str | None, str]:
    """The checks every generation route shares, in vLLM's order; returns (cache_salt, model)."""
    salt = check_cache_salt(body)
    check_field_types(body)
    check_stream_options(body)
    model = check_model(body, served)
    check_n(body)
    return salt, model


def parse_generation(kind: Kind, body: dict[str, Any], ctx: ParseContext) -> GenRequest:
    """Validate one generation body and resolve its prompt, limits and options."""
    salt, model = validate_body(body, ctx.model)
    prompt, text = prompt_of(kind, body)
    max_tokens = requested_max_tokens(kind, body) or ctx.max_tokens_default
    check_engine_limits(prompt, max_tokens, ctx.max_model_len)
    options = body.get("stream_options") or {}
    return GenRequest(
        kind=kind,
        response_id=_ID_PREFIX[kind] + ctx.base_id,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=bool(body.get("stream")),
        include_usage=bool(options.get("include_usage")),
        temperature=_float_or_none(body.get("temperature")),
        seed=body.get("seed"),
        cache_salt=salt,
        caps=transfer_caps(body, ctx.offload),
        directives=parse_directives(text) if text else NO_DIRECTIVES,
        body=body,
    )


def _float_or_none(value: object) -> float | None:
    return float(value) if _is_number(value) else None  # type: ignore[arg-type]
