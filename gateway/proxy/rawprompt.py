"""Long prompts travel upstream as the client wrote them (docs/http.md, "Request fields").

The gateway reads a handful of top-level fields and the start of the prompt; it never changes the prompt. Decoding
a 128k-token prompt into Python strings and encoding it again cost as much as everything else the gateway does
for the request. So a body is decoded in one pass at its top level: every field but the prompt (`messages`,
`prompt`, `input`) becomes Python values as before, and a prompt value of at least RAW_PROMPT_BYTES stays the
client's JSON text — a `msgspec.Raw` view of the body, not a copy — that the encoder writes back unchanged.

That one pass still validates the whole body as JSON (syntax, escapes, surrogate pairs, control characters in
strings); UTF-8, which msgspec does not check in a value it skips, is checked here. Two things are left to the
engine inside a kept prompt, because finding them means decoding it: a number too large for a float (`1e400`),
and a key repeated inside one message object (the engine, like every reader in the gateway, keeps the last).
Keys repeated at the top level, where every field the gateway owns lives, are still merged before the body is
encoded, so only one of each reaches the engine.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.errors import BadRequest
from gateway.proxy.shape import NOT_STRUCTURE

PROMPT_FIELDS = ("messages", "prompt", "input")
RAW_PROMPT_BYTES = 8 * 1024
# Heads decoded for the affinity prefix, smallest first: 256 characters of plain text take about 300 bytes, and
# at most 256 × 12 bytes (`\ud83d\ude00` is one character) plus the brackets and keys before the first text.
HEAD_BYTES = (1024, 4096)
# Bytes that may be backed off at the cut: an escape (`\uXXXX\uXXXX` at most) or a UTF-8 sequence cut in half.
MAX_TRIM = 12
CLOSING = {ord("["): b"]", ord("{"): b"}"}
EMPTY_PAIR = re.compile(rb"\{\}|\[\]")

RawFields = dict[str, msgspec.Raw]


def decode_request(body: bytes, raw_from: int = RAW_PROMPT_BYTES) -> dict[str, Any]:
    """The request as a dict, with a prompt value of `raw_from` bytes or more kept as its JSON text; 400 unless the
    body is one JSON object in valid UTF-8."""
    if len(body) < raw_from:  # no value in it can be kept: one plain decode is three times cheaper
        return parse_json_object(body)
    try:
        fields = msgspec.json.decode(body, type=RawFields)
    except msgspec.ValidationError:
        raise BadRequest("The request body must be a JSON object.") from None
    except msgspec.DecodeError as error:
        raise BadRequest(f"The request body is not valid JSON: {error}") from None
    request: dict[str, Any] = {}
    ascii_body = body.isascii()  # one fast pass; a body that is not ASCII has its kept values checked one by one
    for name, raw in fields.items():
        if name in PROMPT_FIELDS and len(raw) >= raw_from:
            if not ascii_body:
                check_utf8(raw)
            request[name] = raw
        else:
            request[name] = decode_field(raw)
    return request


def parse_json_object(body: bytes) -> dict[str, Any]:
    """The body decoded whole; 400 unless it is one JSON object."""
    try:
        parsed = msgspec.json.decode(body)
    except msgspec.DecodeError as error:
        raise BadRequest(f"The request body is not valid JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise BadRequest("The request body must be a JSON object.")
    return parsed


def decode_field(raw: msgspec.Raw) -> Any:
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError as error:  # out-of-range numbers: the skipping pass checks syntax only
        raise BadRequest(f"The request body is not valid JSON: {error}") from None


def check_utf8(raw: msgspec.Raw) -> None:
    try:
        str(memoryview(raw), "utf-8")
    except UnicodeDecodeError:
        raise BadRequest("The request body is not valid JSON: Invalid UTF-8 encoded string") from None


def decoded(value: object) -> object:
    """A prompt value as Python data, whether it was kept as JSON text or not (DecodeError when it cannot be)."""
    return msgspec.json.decode(value) if isinstance(value, msgspec.Raw) else value


def decoded_head(raw: msgspec.Raw, size: int) -> object | None:
    """The value of the first `size` bytes of a long JSON value, made whole: a string cut there ends at the cut (a
    cut between values, as in a list of token ids, goes back to the last comma) and the open arrays and objects
    are closed. So every value in it is complete except the last one, which may be cut short (a string: its
    start). None when the repair does not decode; the caller then decodes the whole value."""
    if len(raw) <= size:
        return None
    head = bytes(memoryview(raw)[:size])
    inside, skeleton = _cut_state(head)
    if not inside:
        return _head_to_last_comma(head)
    closers = _closers(skeleton)
    if closers is None:
        return None
    # Back off at most to the string's opening quote, so the repair never leaves the string it cuts.
    trims = min(MAX_TRIM, len(head) - head.rfind(b'"') - 1)
    for trim in range(trims + 1):
        try:
            value: object = msgspec.json.decode(head[: len(head) - trim] + b'"' + closers)
            return value
        except msgspec.DecodeError:
            continue  # an escape or a UTF-8 sequence cut in half: back off one more byte
    return None


def _head_to_last_comma(head: bytes) -> object | None:
    """A head cut between values (in a number, a literal, after a colon), made whole up to its last comma."""
    cut = head.rfind(b",")
    if cut < 0:
        return None
    inside, skeleton = _cut_state(head[:cut])
    closers = None if inside else _closers(skeleton)  # a comma inside a string: not repaired
    if closers is None:
        return None
    try:
        value: object = msgspec.json.decode(head[:cut] + closers)
    except msgspec.DecodeError:  # e.g. an object cut after a key: the caller decodes the whole value
        return None
    return value


def _cut_state(head: bytes) -> tuple[bool, bytes]:
    """Whether a JSON prefix ends inside a string, and its brackets and commas outside strings (the method of
    gateway.proxy.shape.structure_outside_strings: escaped backslashes, then escaped quotes, are removed)."""
    if head.find(b"\\\\") >= 0:  # not `in`: see EVENT_END in gateway/proxy/sse.py
        head = head.replace(b"\\\\", b"")
    if head.find(b'\\"') >= 0:
        head = head.replace(b'\\"', b"")
    pieces = head.translate(None, NOT_STRUCTURE).split(b'"')
    return len(pieces) % 2 == 0, b"".join(pieces[::2])


def _closers(skeleton: bytes) -> bytes | None:
    """The brackets that close what a JSON prefix's skeleton leaves open, innermost first."""
    brackets = skeleton.replace(b",", b"")
    while True:
        reduced = EMPTY_PAIR.sub(b"", brackets)
        if reduced == brackets:
            break
        brackets = reduced
    if brackets.find(b"]") >= 0 or brackets.find(b"}") >= 0:
        return None
    return b"".join(CLOSING[opener] for opener in reversed(brackets))
