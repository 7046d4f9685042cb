"""StreamWatch, usage parsing and stream_usage on hand-written byte sequences: each chunk's forwarded bytes,
the usage found, and the shapes (Responses API usage, multi-line data, no blank line at the end) the captured
streams in test_sse.py do not contain."""

from __future__ import annotations

import pytest

from gateway.proxy.sse import (
    MAX_OPEN_EVENT_BYTES,
    StreamWatch,
    Usage,
    stream_usage,
    usage_from_body,
    usage_from_json,
)

USAGE_CHUNK = (b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":7,"completion_tokens":2,'
               b'"prompt_tokens_details":{"cached_tokens":3}}}\n\n')
TEXT_CHUNK = b'data: {"id":"c","choices":[{"index":0,"text":"hi"}]}\n\n'
EMPTY_TEXT = b'data: {"id":"c","choices":[{"index":0,"text":""}]}\n\n'
DONE = b"data: [DONE]\n\n"


def test_a_fresh_watch() -> None:
    watch = StreamWatch(strip_usage=True)
    assert watch.content_seen is False
    assert watch.usage is None
    assert watch.flush() == b""


def test_without_stripping_every_chunk_is_forwarded_as_it_arrives() -> None:
    watch = StreamWatch(strip_usage=False)
    assert watch.feed(b'data: {"choices":[{"te') == (b'data: {"choices":[{"te', False)
    assert watch.feed(b'xt":"a"}]}\n\n') == (b'xt":"a"}]}\n\n', True)
    assert watch.feed(USAGE_CHUNK) == (USAGE_CHUNK, False)
    assert watch.usage == Usage(prompt_tokens=7, cached_tokens=3, completion_tokens=2)
    assert watch.feed(b"data: [DO") == (b"data: [DO", False)
    assert watch.flush() == b""


def test_with_stripping_only_complete_events_are_forwarded() -> None:
    watch = StreamWatch(strip_usage=True)
    assert watch.feed(b"\n\n") == (b"\n\n", False)
    assert watch.feed(TEXT_CHUNK[:10]) == (b"", False)
    assert watch.feed(TEXT_CHUNK[10:]) == (TEXT_CHUNK, True)
    assert watch.content_seen is True
    assert watch.feed(TEXT_CHUNK) == (TEXT_CHUNK, False)  # first content is reported once
    assert watch.feed(USAGE_CHUNK + DONE[:6]) == (b"", False)
    assert watch.usage == Usage(prompt_tokens=7, cached_tokens=3, completion_tokens=2)
    assert watch.flush() == DONE[:6] + b"\n\n"  # the final event is completed, so its usage would be seen
    assert watch.feed(DONE[6:]) == (DONE[6:], False)  # the tail was emptied by flush


def test_empty_text_is_not_first_content() -> None:
    watch = StreamWatch(strip_usage=False)
    assert watch.feed(EMPTY_TEXT) == (EMPTY_TEXT, False)
    assert watch.feed(TEXT_CHUNK)[1] is True


def test_intermediate_usage_is_neither_taken_nor_stripped() -> None:
    """Continuous usage stats put usage on content chunks; only the final usage event counts and is cut."""
    continuous = b'data: {"choices":[{"index":0,"text":"a"}],"usage":{"prompt_tokens":1}}\n\n'
    watch = StreamWatch(strip_usage=True)
    assert watch.feed(continuous) == (continuous, True)
    assert watch.usage is None
    lonely = b'data: {"object":"x","choices":[]}\n\n'
    assert watch.feed(lonely + USAGE_CHUNK) == (lonely, False)  # choices:[] without usage is kept
    assert watch.usage is not None and watch.usage.prompt_tokens == 7


def test_responses_api_completion_carries_the_usage() -> None:
    event = (b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
             b'{"input_tokens":9,"output_tokens":4,"input_tokens_details":{"cached_tokens":8}}}}\n\n')
    watch = StreamWatch(strip_usage=False)
    assert watch.feed(event) == (event, False)
    assert watch.usage == Usage(prompt_tokens=9, cached_tokens=8, completion_tokens=4)


@pytest.mark.parametrize(
    ("body", "usage"),
    [({"usage": {"prompt_tokens": 5, "completion_tokens": 1}}, Usage(5, 0, 1)),
     ({"usage": {"input_tokens": 6, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 4}}}, Usage(6, 4, 2)),
     ({"usage": {"prompt_tokens": 5, "input_tokens": 9}}, Usage(5, 0, 0)),
     ({"usage": {"prompt_tokens": 5}, "response": {"usage": {"input_tokens": 9}}}, Usage(5, 0, 0)),
     ({"response": {"usage": {"input_tokens": 9}}}, Usage(9, 0, 0)),
     ({"usage": {"prompt_tokens": "5", "completion_tokens": True, "prompt_tokens_details": [3]}}, Usage(0, 0, 0)),
     ({"usage": {"prompt_tokens": None, "prompt_tokens_details": None}}, Usage(0, 0, 0)),
     ({"usage": None}, None), ({"response": "x"}, None), ({}, None)],
)
def test_usage_from_body(body: dict[str, object], usage: Usage | None) -> None:
    assert usage_from_body(body) == usage


def test_usage_from_json_refuses_what_is_not_an_object() -> None:
    assert usage_from_json(b"{") is None
    assert usage_from_json(b'[{"usage":{"prompt_tokens":1}}]') is None
    assert usage_from_json(b'{"usage":{"prompt_tokens":1}}') == Usage(1, 0, 0)


@pytest.mark.parametrize(
    ("stream", "prompt_tokens"),
    [(USAGE_CHUNK, 7),  # the only event: no blank line before it
     (TEXT_CHUNK + USAGE_CHUNK + DONE, 7),
     (TEXT_CHUNK + USAGE_CHUNK.rstrip(b"\n"), 7),  # no blank line after it
     (b'data: {"choices":[],\ndata: "usage":{"prompt_tokens":4}}\n\n', 4),  # one event, two data lines
     (b'data:{"choices":[],"usage":{"prompt_tokens":5}}\n\n', 5),  # no space after the colon
     (b"\n\n" + USAGE_CHUNK, 7),  # a blank line first
     (b"x\n\n" + USAGE_CHUNK, 7),
     (TEXT_CHUNK + DONE, None),
     (b'data: [{"usage":{"prompt_tokens":1}}]\n\n', None)],
)
def test_stream_usage(stream: bytes, prompt_tokens: int | None) -> None:
    usage = stream_usage(stream)
    assert (usage.prompt_tokens if usage else None) == prompt_tokens


def test_after_the_first_content_a_whole_event_is_still_read_when_it_may_name_usage() -> None:
    """The steady-state shortcut passes whole events on unread; a usage key spelled with escapes, or a CRLF
    stream, must still take the reading path (usage counted, and cut when the gateway asked for it)."""
    escaped = USAGE_CHUNK.replace(b'"usage"', b'"\\u0075sage"')
    watch = StreamWatch(strip_usage=True)
    assert watch.feed(TEXT_CHUNK) == (TEXT_CHUNK, True)
    assert watch.feed(TEXT_CHUNK) == (TEXT_CHUNK, False)
    assert watch.feed(escaped) == (b"", False)
    assert watch.usage == Usage(prompt_tokens=7, cached_tokens=3, completion_tokens=2)
    crlf = StreamWatch(strip_usage=True)
    assert crlf.feed(TEXT_CHUNK)[1] is True
    mixed = TEXT_CHUNK.replace(b"\n", b"\r\n") + TEXT_CHUNK  # a CRLF event, then an LF one: ends in LF LF
    assert crlf.feed(mixed) == (TEXT_CHUNK + TEXT_CHUNK, False)  # forwarded with LF line ends


def giant_event(size: int, line_end: bytes) -> bytes:
    """An event of about `size` bytes with neither content nor usage (as vLLM's `prompt_logprobs` of a long
    prompt), written with `line_end`."""
    filler = b'{"1":{"logprob":-0.5,"rank":1,"decoded_token":"x"}},' * (size // 52)
    return b'data: {"id":"c","choices":[],"prompt_logprobs":[' + filler + b'{}]}' + line_end * 2


@pytest.mark.parametrize("sizes", [[65536, 1, 2, 3], [100_000, 7], [3_000_001], [65536, 1, 1, 1, 1]])
@pytest.mark.parametrize("line_end", [b"\n", b"\r\n", b"\r"])
def test_an_event_longer_than_the_bound_is_passed_on_unread_and_the_stream_after_it_is_read(
    sizes: list[int], line_end: bytes
) -> None:
    """A stream's scan never holds more than MAX_OPEN_EVENT_BYTES (and one read) of an incomplete event: past it,
    the event is passed on unread, up to its end, and counted; the events after it are read as before (content,
    usage, the usage event cut out), and no byte is lost or doubled. Wrong version: no bound (the whole event is
    held until its end, however long)."""
    def written(event: bytes) -> bytes:
        return event.replace(b"\n", line_end)

    giant = giant_event(MAX_OPEN_EVENT_BYTES + 3_500_000, line_end)  # open past the bound at every read size
    spaced = b'data: {"id": "c", "choices": [{"index": 0, "text": "hi"}]}\n\n'  # content found only by decoding
    stream = written(EMPTY_TEXT) + giant + written(spaced) + written(USAGE_CHUNK) + written(DONE)
    watch, forwarded, held, first_at, offset, turn = StreamWatch(strip_usage=True), [], 0, None, 0, 0
    while offset < len(stream):
        piece = stream[offset:offset + sizes[turn % len(sizes)]]
        offset, turn = offset + len(piece), turn + 1
        out, first = watch.feed(piece)
        forwarded.append(out)
        held = max(held, len(watch._tail))
        if first:
            first_at = offset
    forwarded.append(watch.flush())
    expected = EMPTY_TEXT + giant.replace(b"\r\n", b"\n").replace(b"\r", b"\n") + spaced + DONE
    assert b"".join(forwarded) == expected
    assert watch.events_unread == 1
    assert held <= MAX_OPEN_EVENT_BYTES + max(sizes)
    assert first_at is not None and first_at >= stream.index(written(spaced)) + len(spaced) - 2
    assert watch.usage == Usage(prompt_tokens=7, cached_tokens=3, completion_tokens=2)


def test_an_event_just_within_the_bound_is_read_whole() -> None:
    watch = StreamWatch(strip_usage=True)
    event = giant_event(MAX_OPEN_EVENT_BYTES - 1_000, b"\n")
    out = [watch.feed(event[i:i + 65536])[0] for i in range(0, len(event), 65536)]
    assert b"".join(out) == event and watch.events_unread == 0
