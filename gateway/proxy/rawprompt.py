"""Long prompts travel upstream as the client wrote them (docs/http.md, "Request fields").

The gateway reads a handful of top-level fields and the start of the prompt; it never changes the prompt. Decoding
a 128k-token prompt into Python strings and encoding it again cost as much as everything else the gateway does
for the request. So a body is decoded in one pass at its top level: every field but the prompt (`messages`,
`prompt`, `input`) becomes Python values as before, and a prompt value of at least RAW_PROMPT_BYTES stays the
client's JSON text — a `msgspec.Raw` view of the body, not a copy — that the encoder writes back unchanged.

That one pass still validates the whole body as JSON (syntax, escapes, surrogate pairs, control characters in
strings); UTF-8, which msgspec does not check in a value it skips, is checked here. Two things are left to the
engine inside a kept prompt, because finding them means decoding it: a number too large for a float (`1e400`),
and a key repeated inside one message object (the engine keeps the last). Keys repeated at the top level, where
every field the gateway owns lives, are still merged before the body is encoded, so only one of each reaches the
engine.

Readers of a kept prompt's start: the affinity prefix takes `decoded_head` as it stands (a preference among
replicas, nothing more); the admission key takes `exact_head`, which refuses a head that a member after the cut
could contradict, so it reads what the engine reads.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from gateway.errors import BadRequest
from gateway.proxy.shape import backslashes_before, json_skeleton

PROMPT_FIELDS = ("messages", "prompt", "input")
RAW_PROMPT_BYTES = 8 * 1024
# Heads decoded for the affinity prefix, smallest first: 256 characters of plain text take about 300 bytes, and
# at most 256 × 12 bytes (`\ud83d\ude00` is one character) plus the brackets and keys before the first text.
HEAD_BYTES = (1024, 4096)
# Bytes that may be backed off at the cut: an escape (`\uXXXX\uXXXX` at most) or a UTF-8 sequence cut in half.
MAX_TRIM = 12
CLOSING = {ord("["): b"]", ord("{"): b"}"}
EMPTY_PAIR = re.compile(rb"\{\}|\[\]")
# Ends the cut string in an exact head: a noncharacter, which text rarely holds (where it does, a reader that stops
# at the first one stops early, never late).
CUT_MARK = "\uffff"
# How far an exact head's check reads past the cut: the cut string's end is found window by window, giving up after
# QUOTE_BUDGET escaped quotes (a long quoted text then takes the whole decode); AFTER_CUT_BYTES is the whitespace
# and closing brackets it reads after that string.
SCAN_WINDOW = 64 * 1024
QUOTE_BUDGET = 64
AFTER_CUT_BYTES = 256
JSON_SPACE = frozenset(b" \t\r\n")

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
    repaired = _repaired_head(raw, size, b"")
    return None if repaired is None else repaired.value


def exact_head(raw: msgspec.Raw, size: int) -> object | None:
    """The head as `decoded_head` makes it, with CUT_MARK ending the string the cut falls in, and only when nothing
    after the cut can change a value before it: every object open at the cut closes right after the cut value. (A
    member after it could repeat an earlier key, and the engine reads the last one, or hold a key a reader puts
    first, such as a message's role after its content.) Then the head is the whole value with the cut string
    shortened and marked and the items after it dropped, so a reader that walks the head in order reads the whole
    value's start up to the mark. None otherwise; the caller then decodes the whole value."""
    repaired = _repaired_head(raw, size, CUT_MARK.encode())
    if repaired is None:
        return None
    if repaired.closers.find(b"}") >= 0 and not _closes_after_cut(memoryview(raw), repaired):
        return None
    return repaired.value


class _Repaired(msgspec.Struct, frozen=True):
    value: object
    closers: bytes  # the brackets that close what the head left open, innermost first
    cut: int  # where the head ends in the value
    string_cut: bool  # the cut fell inside a string (else the head went back to its last comma)


def _repaired_head(raw: msgspec.Raw, size: int, mark: bytes) -> _Repaired | None:
    if len(raw) <= size:
        return None
    head = bytes(memoryview(raw)[:size])
    skeleton, inside = json_skeleton(head)
    if not inside:
        return _head_to_last_comma(head)
    closers = _closers(skeleton)
    if closers is None:
        return None
    # Back off at most to the string's opening quote, so the repair never leaves the string it cuts.
    trims = min(MAX_TRIM, len(head) - head.rfind(b'"') - 1)
    for trim in range(trims + 1):
        try:
            value: object = msgspec.json.decode(head[: len(head) - trim] + mark + b'"' + closers)
            return _Repaired(value, closers, size, string_cut=True)
        except msgspec.DecodeError:
            continue  # an escape or a UTF-8 sequence cut in half: back off one more byte
    return None


def _closes_after_cut(view: memoryview, repaired: _Repaired) -> bool:
    """Whether every object open at the cut closes right after the cut value, with only whitespace between its
    closing brackets; a list open there may go on once no object is open around it (later items add, they
    replace nothing). Undecided (False) past QUOTE_BUDGET escaped quotes or AFTER_CUT_BYTES of whitespace."""
    if not repaired.string_cut:
        return False  # a value dropped at the comma may be an object's member: only lists may be open (above)
    end = _string_end(view, repaired.cut)
    if end < 0:
        return False
    after = bytes(view[end + 1 : end + 1 + AFTER_CUT_BYTES])
    position = 0
    for index, closer in enumerate(repaired.closers):
        if repaired.closers.find(b"}", index) < 0:
            return True
        while position < len(after) and after[position] in JSON_SPACE:
            position += 1
        if position == len(after) or after[position] != closer:
            return False  # a comma: a member, or an item inside an object still open
        position += 1
    return True


def _string_end(view: memoryview, start: int) -> int:
    """Where the JSON string that `start` lies in ends (the value is valid JSON, so it does), found window by window
    without copying the whole value; -1 past QUOTE_BUDGET escaped quotes, or a run of more than QUOTE_BUDGET
    backslashes before a quote."""
    escaped = 0
    for window_start in range(start, len(view), SCAN_WINDOW):
        window = bytes(view[window_start : window_start + SCAN_WINDOW])
        found = window.find(b'"')
        while found >= 0:
            quote = window_start + found
            backslashes = backslashes_before(view, quote, QUOTE_BUDGET)
            if backslashes > QUOTE_BUDGET:
                return -1
            if backslashes % 2 == 0:
                return quote
            escaped += 1
            if escaped > QUOTE_BUDGET:
                return -1
            found = window.find(b'"', found + 1)
    return -1


def _head_to_last_comma(head: bytes) -> _Repaired | None:
    """A head cut between values (in a number, a literal, after a colon), made whole up to its last comma."""
    cut = head.rfind(b",")
    if cut < 0:
        return None
    skeleton, inside = json_skeleton(head[:cut])
    closers = None if inside else _closers(skeleton)  # a comma inside a string: not repaired
    if closers is None:
        return None
    try:
        value: object = msgspec.json.decode(head[:cut] + closers)
    except msgspec.DecodeError:  # e.g. an object cut after a key: the caller decodes the whole value
        return None
    return _Repaired(value, closers, cut, string_cut=False)


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
