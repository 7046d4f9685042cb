"""Bounds on the shape of request bodies and identity fields, checked before a body is decoded.

A JSON body within `max_body_bytes` can still nest deeply enough to exhaust the decoder's recursion
(msgspec raises RecursionError past about 1,000 levels) or hold a million tiny values that decode to
hundreds of megabytes of Python objects. Both are refused with 400 before decoding, by a scan that runs
in C (bytes methods and one regex over the brackets alone): strings are removed first, so brackets and commas
inside them never count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gateway.errors import BadRequest

USER_MAX_BYTES = 256
EMPTY_PAIR = re.compile(rb"\{\}|\[\]")
STRUCTURE = frozenset(b'{}[],"')
NOT_STRUCTURE = bytes(byte for byte in range(256) if byte not in STRUCTURE)
BACKSLASH = ord("\\")
# json_skeleton walks the quotes of a text with escapes while it holds at most one quote in this many bytes.
QUOTE_WALK_BYTES = 200
QUOTE_SAMPLE_BYTES = 4096


@dataclass(frozen=True)
class JsonLimits:
    max_depth: int
    max_items: int


def check_json_shape(body: bytes, limits: JsonLimits) -> None:
    """400 when `body` nests deeper than `max_depth` or holds more than `max_items` values."""
    openers = count_up_to(body, b"{", limits.max_depth + 1) + count_up_to(body, b"[", limits.max_depth + 1)
    # Values are counted as openers plus commas, so a body of at most `max_items` bytes cannot hold too many:
    # its commas need not be counted (bytes.count reads every byte; the opener counts above are memchr jumps).
    # Past max_depth openers the skeleton below counts the values anyway, so the commas are not counted twice.
    if openers <= limits.max_depth and (
        len(body) <= limits.max_items or openers + comma_count(body) <= limits.max_items
    ):
        return  # even counting brackets inside strings, neither bound can be reached
    skeleton = structure_outside_strings(body)
    closers = skeleton.count(b"}") + skeleton.count(b"]")
    if len(skeleton) - closers > limits.max_items:
        raise BadRequest(f"The JSON body holds more than {limits.max_items} values.")
    if json_depth_exceeds(skeleton.replace(b",", b""), limits.max_depth):
        raise BadRequest(f"The JSON body nests deeper than {limits.max_depth} levels.")


SPARSE_COMMAS = 64


def comma_count(body: bytes) -> int:
    """How many commas `body` holds. bytes.count compares every byte (about 0.16 ms for a 550 KiB prompt); when
    there are few commas, jumping from one to the next with memchr (bytes.find) is ten times cheaper."""
    sparse = count_up_to(body, b",", SPARSE_COMMAS)
    return sparse if sparse < SPARSE_COMMAS else body.count(b",")


def count_up_to(body: bytes, byte: bytes, limit: int) -> int:
    """How often `byte` occurs, counted only up to `limit` (each step a memchr, cheap when it is rare)."""
    count, at = 0, body.find(byte)
    while at >= 0 and count < limit:
        count += 1
        at = body.find(byte, at + 1)
    return count


def structure_outside_strings(body: bytes) -> bytes:
    """The brackets and commas of a JSON text that lie outside its strings, in order."""
    return json_skeleton(body)[0]


def json_skeleton(text: bytes) -> tuple[bytes, bool]:
    """The brackets and commas of a JSON text (or of its start) that lie outside its strings, in order, and whether
    the text ends inside a string.

    Each way runs in C as far as CPython allows (a regex that skips strings costs about twenty times as much):
    - a text without a backslash has no escapes: one pass keeps its brackets, commas and quotes, and the pieces
      between every other quote lie outside strings;
    - a text with escapes walks from quote to quote (memchr; a quote after an odd run of backslashes is escaped)
      and keeps the brackets and commas of the pieces between strings;
    - a text with escapes and many quotes has its escaped backslashes and quotes removed first, then takes the
      first way. Each search for a two-byte needle reads every byte (0.3-1 ns a byte, by machine) and the walk
      costs 0.3-0.6 µs a quote, so the walk is not started when the first QUOTE_SAMPLE_BYTES hold over four
      quotes per QUOTE_WALK_BYTES, and gives up past one per QUOTE_WALK_BYTES of the whole text.
    """
    if text.find(b"\\") < 0:  # memchr
        return _skeleton_without_escapes(text)
    sampled = min(len(text), QUOTE_SAMPLE_BYTES)
    if text.count(b'"', 0, sampled) * QUOTE_WALK_BYTES > 4 * sampled:  # dense from the start: the walk would give up
        return _skeleton_without_escapes(_escapes_removed(text))
    positions = _string_quotes(text, len(text) // QUOTE_WALK_BYTES + 16)
    if positions is None:
        return _skeleton_without_escapes(_escapes_removed(text))
    starts = [0, *(quote + 1 for quote in positions[1::2])]
    ends = [*positions[0::2], len(text)][: len(starts)]  # after an opening quote with no closing one: inside
    outside = b"".join(text[start:end] for start, end in zip(starts, ends, strict=True))
    return outside.translate(None, NOT_STRUCTURE), len(positions) % 2 == 1


def _string_quotes(text: bytes, budget: int) -> list[int] | None:
    """The positions of the quotes that open and close strings; None once more than `budget` quotes and
    backslashes before them have been looked at (each is a step in Python)."""
    positions: list[int] = []
    looked = 0
    at = text.find(b'"')
    while at >= 0:
        backslashes = backslashes_before(text, at, budget - looked)
        looked += 1 + backslashes
        if looked > budget:
            return None
        if backslashes % 2 == 0:
            positions.append(at)
        at = text.find(b'"', at + 1)
    return positions


def backslashes_before(data: bytes | memoryview, at: int, limit: int) -> int:
    """How many backslashes stand right before position `at` (an odd number escapes what is there), counted up to
    `limit` + 1: a longer run reads as limit + 1, so a caller that gives up past `limit` never walks all of it."""
    count = 0
    while count <= limit and at > count and data[at - 1 - count] == BACKSLASH:
        count += 1
    return count


def _escapes_removed(text: bytes) -> bytes:
    """The text without its escaped backslashes (in pairs, left to right, as a JSON parser reads them), then
    without its escaped quotes: every quote left opens or closes a string."""
    if text.find(b"\\\\") >= 0:  # not `in`: see EVENT_END in gateway/proxy/sse.py
        text = text.replace(b"\\\\", b"")
    if text.find(b'\\"') >= 0:
        text = text.replace(b'\\"', b"")
    return text


def _skeleton_without_escapes(text: bytes) -> tuple[bytes, bool]:
    """json_skeleton of a text in which every quote opens or closes a string."""
    pieces = text.translate(None, NOT_STRUCTURE).split(b'"')
    return b"".join(pieces[::2]), len(pieces) % 2 == 0


def json_depth_exceeds(brackets: bytes, max_depth: int) -> bool:
    """Whether a bracket skeleton nests deeper than `max_depth`: each pass removes the innermost level."""
    for _ in range(max_depth):
        if not brackets:
            return False
        brackets = EMPTY_PAIR.sub(b"", brackets)
    return bool(brackets)


def check_user_value(value: object, param: str) -> None:
    """400 when a user identifier (`user` or the rollout user header) is longer than USER_MAX_BYTES."""
    if isinstance(value, str):
        size = len(value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, bytes):
        size = len(value)
    else:
        return  # the field's type is checked where it is interpreted
    if size > USER_MAX_BYTES:
        raise BadRequest(f"{param} may be at most {USER_MAX_BYTES} bytes.", param=param)
