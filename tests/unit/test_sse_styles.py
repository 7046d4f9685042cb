"""The SSE scan does not depend on JSON or SSE style (hypothesis).

Each captured vLLM stream is re-serialised: other key orders, spaces or newlines after `:` and `,`, characters
written as `\\uXXXX` escapes (keys included, so `usage` may arrive as `\\u0075sage`), non-ASCII escaped or not,
LF, CRLF or CR line ends, `data:` with or without its space, JSON spread over several `data:` lines, comment
lines and `id:` fields — and fed in arbitrary chunks. TTFT (the chunk that completes the first content event),
usage and cached tokens, usage-chunk stripping, the shadow text and the assembled reply must all be the same
as for the stream as captured. The same holds for a Responses-API stream (`event:` lines, usage in
`response.completed`; no capture of that route exists, so it is written here) and for the miss path's peek.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy.assemble import StreamAssembler
from gateway.proxy.sse import (
    OutcomeScreen,
    StreamWatch,
    Usage,
    first_outcome,
    has_content,
    is_usage_chunk,
    stream_objects,
    stream_usage,
)
from gateway.shadow.compare import generated_text

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "http"
CAPTURES = sorted(FIXTURES.glob("*.sse.txt"))


def captured_events(path: Path) -> list[bytes]:
    body = path.read_bytes().split(b"\n\n", 1)[1]
    return [event for event in body.split(b"\n\n") if event.strip()]


@dataclass(frozen=True)
class Style:
    item_separator: str  # between object members and array items (whitespace around the comma)
    key_separator: str  # between a key and its value
    escape_share: float  # share of characters written as \\uXXXX
    ensure_ascii: bool
    line_end: str
    data_space: bool
    comments: bool
    seed: int


def encode(value: Any, style: Style, rnd: random.Random) -> str:
    if isinstance(value, dict):
        items = list(value.items())
        rnd.shuffle(items)
        members = [encode_string(key, style, rnd) + style.key_separator + encode(item, style, rnd)
                   for key, item in items]
        return "{" + style.item_separator.join(members) + "}"
    if isinstance(value, list):
        return "[" + style.item_separator.join(encode(item, style, rnd) for item in value) + "]"
    if isinstance(value, str):
        return encode_string(value, style, rnd)
    return json.dumps(value)


def encode_string(text: str, style: Style, rnd: random.Random) -> str:
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\' or code < 0x20:
            out.append(json.dumps(char)[1:-1])
        elif rnd.random() < style.escape_share or (style.ensure_ascii and code > 0x7F):
            out.append(json.dumps(char, ensure_ascii=True)[1:-1] if code > 0x7F else f"\\u{code:04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def restyle(events: list[bytes], style: Style) -> list[bytes]:
    rnd = random.Random(style.seed)
    styled = []
    for number, event in enumerate(events):
        data = event.decode()[len("data: "):]
        text = data if data == "[DONE]" else encode(json.loads(data), style, rnd)
        prefix = "data: " if style.data_space else "data:"
        lines = [prefix + line for line in text.split("\n")]
        if style.comments:
            lines = [": keep-alive", f"id: {number}", *lines]
        styled.append((style.line_end.join(lines) + style.line_end * 2).encode())
    return styled


styles = st.builds(
    Style,
    item_separator=st.sampled_from([",", ", ", " , ", ",\n", "\t,\n "]),
    key_separator=st.sampled_from([":", ": ", " : ", ":\n"]),
    escape_share=st.sampled_from([0.0, 0.1, 1.0]),
    ensure_ascii=st.booleans(),
    line_end=st.sampled_from(["\n", "\r\n", "\r"]),
    data_space=st.booleans(),
    comments=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)


def chunks_of(stream: bytes, sizes: list[int]) -> list[bytes]:
    pieces, offset, turn = [], 0, 0
    while offset < len(stream):
        size = sizes[turn % len(sizes)]
        pieces.append(stream[offset : offset + size])
        offset, turn = offset + size, turn + 1
    return pieces


def first_content_index(events: list[bytes]) -> int:
    for index, event in enumerate(events):
        objects = list(stream_objects(event + b"\n\n"))
        if objects and has_content(objects[0]):
            return index
    raise AssertionError("a captured stream without content")


def watch_stream(styled: list[bytes], sizes: list[int], strip: bool) -> tuple[StreamWatch, bytes, int | None]:
    """Feed in chunks; returns the watch, the bytes forwarded, and the offset that ended the first-content chunk."""
    stream = b"".join(styled)
    watch = StreamWatch(strip_usage=strip)
    forwarded, offset, first_end = b"", 0, None
    for piece in chunks_of(stream, sizes):
        forward, first = watch.feed(piece)
        offset += len(piece)
        if first:
            assert first_end is None, "first content reported twice"
            first_end = offset
        forwarded += forward
    return watch, forwarded + watch.flush(), first_end


def expected(events: list[bytes]) -> tuple[Usage | None, str | None, list[dict[str, Any]]]:
    stream = b"\n\n".join(events) + b"\n\n"
    return stream_usage(stream), generated_text(stream), list(stream_objects(stream))


@settings(max_examples=150, deadline=None)
@given(capture=st.sampled_from(CAPTURES), style=styles, sizes=st.lists(st.integers(1, 400), min_size=1, max_size=8),
       strip=st.booleans())
def test_any_serialisation_gives_the_same_answers(capture: Path, style: Style, sizes: list[int], strip: bool) -> None:
    events = captured_events(capture)
    usage, text, objects = expected(events)
    styled = restyle(events, style)
    stream = b"".join(styled)

    watch, forwarded, first_end = watch_stream(styled, sizes, strip)
    # TTFT: reported by exactly the chunk that completes the first content event (with CRLF, its second CR
    # already ends the blank line).
    content_end = sum(len(event) for event in styled[: first_content_index(events) + 1])
    content_end -= style.line_end == "\r\n"
    assert first_end is not None
    assert first_end >= content_end and first_end - content_end < sizes_at(stream, sizes, first_end)
    assert watch.usage == usage and usage is not None and usage.prompt_tokens > 0
    forwarded_objects = list(stream_objects(forwarded))
    if strip:
        assert forwarded_objects == [chunk for chunk in objects if not is_usage_chunk(chunk)]
        assert forwarded.replace(b"\r", b"\n").rstrip(b"\n").endswith(b"[DONE]")
    else:
        assert forwarded == stream

    assert stream_usage(stream) == usage
    assert generated_text(stream) == text
    assert assembled(stream, capture) == assembled(b"\n\n".join(events) + b"\n\n", capture)


def sizes_at(stream: bytes, sizes: list[int], end: int) -> int:
    """The size of the chunk that ended at `end`."""
    offset = 0
    for piece in chunks_of(stream, sizes):
        offset += len(piece)
        if offset == end:
            return len(piece)
    raise AssertionError("no chunk ends there")


def assembled(stream: bytes, capture: Path) -> tuple[int, dict[str, Any]]:
    assembler = StreamAssembler(chat="chat" in capture.name)
    assembler.feed(stream)
    return assembler.result()


def test_a_space_after_the_colon_is_not_missed() -> None:
    """The review's case: Python's json.dumps style, which the byte patterns used to miss."""
    events = captured_events(FIXTURES / "offload_stream_chat.sse.txt")
    spaced = [b"data: " + json.dumps(json.loads(event[6:])).encode() + b"\n\n" if event != b"data: [DONE]"
              else event + b"\n\n" for event in events]
    watch, forwarded, first_end = watch_stream(spaced, [10_000], strip=True)
    assert first_end is not None
    assert watch.usage is not None and watch.usage.prompt_tokens > 0
    assert b'"usage"' not in forwarded


# -- the Responses API: `event:` lines, usage in `response.completed` (no capture of it exists) ------------

RESPONSE_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("response.created", {"response": {"id": "resp_1", "status": "in_progress", "output": [], "usage": None,
                                       "text": None, "instructions": None}}),
    ("response.content_part.added", {"item_id": "msg_1", "part": {"type": "output_text", "text": ""}}),
    ("response.output_text.delta", {"item_id": "msg_1", "delta": "Bonjour", "logprobs": []}),
    ("response.output_text.delta", {"item_id": "msg_1", "delta": " \u00e0 vous \"\u2603\"", "logprobs": []}),
    ("response.output_text.done", {"item_id": "msg_1", "text": "Bonjour \u00e0 vous \"\u2603\""}),
    ("response.completed", {"response": {"id": "resp_1", "status": "completed", "usage": {
        "input_tokens": 40, "input_tokens_details": {"cached_tokens": 32}, "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 42}}}),
]


def responses_stream(style: Style) -> list[bytes]:
    rnd = random.Random(style.seed)
    prefix = "data: " if style.data_space else "data:"
    styled = []
    for kind, payload in RESPONSE_EVENTS:
        text = encode({"type": kind, **payload}, style, rnd)
        lines = [f"event: {kind}", *(prefix + line for line in text.split("\n"))]
        styled.append((style.line_end.join(lines) + style.line_end * 2).encode())
    return styled


@settings(max_examples=100, deadline=None)
@given(style=styles, sizes=st.lists(st.integers(1, 200), min_size=1, max_size=6))
def test_responses_streams_in_any_style(style: Style, sizes: list[int]) -> None:
    styled = responses_stream(style)
    watch, forwarded, first_end = watch_stream(styled, sizes, strip=False)
    content_end = sum(len(event) for event in styled[:3]) - (style.line_end == "\r\n")
    assert first_end is not None and first_end >= content_end
    assert first_end - content_end < sizes_at(b"".join(styled), sizes, first_end)
    expected = Usage(prompt_tokens=40, cached_tokens=32, completion_tokens=2)
    assert watch.usage == expected and stream_usage(forwarded) == expected
    assert generated_text(forwarded) == "Bonjour \u00e0 vous \"\u2603\""


# -- the miss path's peek: content or an error event first --------------------------------------------------


def outcome_events(style: Style) -> tuple[bytes, bytes, bytes]:
    """A chat stream's role event, a content event and an error event, written in `style`."""
    rnd = random.Random(style.seed)
    prefix = "data: " if style.data_space else "data:"

    def event(value: dict[str, Any]) -> bytes:
        lines = [prefix + line for line in encode(value, style, rnd).split("\n")]
        if style.comments:
            lines.insert(0, ": keep-alive")
        return (style.line_end.join(lines) + style.line_end * 2).encode()

    return (event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
            event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
            event({"error": {"message": "load failed", "type": "InternalServerError", "code": 500}}))


@pytest.mark.parametrize("style", [
    Style(",", ":", 0.0, False, "\n", True, False, 1),
    Style(", ", ": ", 1.0, True, "\r\n", False, True, 2),
    Style(",\n", " : ", 0.1, False, "\r", True, False, 3),
])
def test_first_outcome_in_any_style(style: Style) -> None:
    role, content, error = outcome_events(style)
    assert first_outcome(role) is None
    assert first_outcome(role + content + error) == "content"
    assert first_outcome(role + error + content) == "error"
    assert first_outcome(role + content[:-2]) is None  # not complete yet


@settings(max_examples=300, deadline=None)
@given(style=styles, sizes=st.lists(st.integers(1, 40), min_size=1, max_size=8), error_first=st.booleans(),
       roles=st.integers(1, 4))
def test_the_read_by_read_screen_agrees_with_first_outcome_after_every_read(
    style: Style, sizes: list[int], error_first: bool, roles: int
) -> None:
    """The miss path screens each read as it comes (OutcomeScreen reads each event once); after every read it
    must say what `first_outcome` says of everything read so far, wherever the reads cut the events, their line
    ends included (a CRLF cut between its CR and its LF)."""
    role, content, error = outcome_events(style)
    stream = role * roles + (error + content if error_first else content + error)
    screen, found, offset = OutcomeScreen(), None, 0
    for piece in chunks_of(stream, sizes):
        offset += len(piece)
        found = screen.feed(piece)
        assert found == first_outcome(stream[:offset]), offset
        if found is not None:
            break
    assert found == ("error" if error_first else "content")
