"""Read SSE streams from vLLM: first generated content, the usage event, and the events' JSON objects.

The one `data:` reader of the gateway. It works on events, not on byte patterns, so any valid serialisation
of the same events gives the same answers: spaces after `:` and `,`, any key order, escaped characters
(`\\u0041`), CRLF or CR line ends, `data:` with or without its space, data split over several lines.

Cost on the relay path is kept to what the answer needs: an event's JSON is decoded only while the first
content is still unseen (vLLM's role chunk; its first token chunk is recognised by a byte pattern of vLLM's
own style, a shortcut that is only ever trusted when it matches), or when the event can name a `usage` key
at all (the word itself, or a `\\u` escape that could spell it). Other events pass with two substring scans.
When the gateway asked upstream for usage the client did not want, the usage-only event is cut out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

# Substring tests below are written `data.find(WORD) >= 0`, not `WORD in data`: for a bytes operand, CPython's
# bytes `in` first tries the operand as an integer and formats (then clears) a TypeError, about 200 ns per test on
# 3.12 against the search's few dozen. (An integer operand, as BACKSLASH and CR, is a memchr: `in` is the cheap
# form there.) The per-event fast path of StreamWatch.feed uses `partition`, cheaper still (see there).
EVENT_END = b"\n\n"
USAGE_WORD = b"usage"
ESCAPE = b"\\u"  # a key written with \u escapes could spell "usage"
BACKSLASH = ord("\\")
CR = ord("\r")
LF = ord("\n")
DONE = b"[DONE]"
RESPONSES_COMPLETED = "response.completed"
RESPONSES_TEXT_DELTA = "response.output_text.delta"
DELTA_CONTENT_KEYS = ("content", "reasoning_content", "reasoning")
# A shortcut, not the rule: in vLLM's compact style this byte pattern is a key with a non-empty string (or a
# tool-call list) — a certain positive without decoding. Any other style falls through to the decoded check.
# An event not complete after this many bytes is passed on unread up to its end, so a stream's scan holds at most
# this much (vLLM's largest events, `prompt_logprobs` of a long prompt, can reach megabytes; they carry no content
# and no usage). Counted in `events_unread`.
MAX_OPEN_EVENT_BYTES = 8 * 1024 * 1024
COMPACT_CONTENT = re.compile(rb'"(?:text|content|delta|reasoning_content|reasoning)":"[^"]|"tool_calls":\[\{')


@dataclass
class Usage:
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


def usage_from_body(body: dict[str, Any]) -> Usage | None:
    """Usage of a chat/completions body, a usage chunk, or a Responses-API object."""
    usage = body.get("usage")
    if not isinstance(usage, dict) and isinstance(body.get("response"), dict):
        usage = body["response"].get("usage")
    if not isinstance(usage, dict):
        return None
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return Usage(
        prompt_tokens=_int(usage.get("prompt_tokens", usage.get("input_tokens"))),
        cached_tokens=_int(details.get("cached_tokens") if isinstance(details, dict) else None),
        completion_tokens=_int(usage.get("completion_tokens", usage.get("output_tokens"))),
    )


def usage_from_json(body: bytes) -> Usage | None:
    parsed = _decode(body)
    return usage_from_body(parsed) if parsed is not None else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


# -- the one reader of SSE events --------------------------------------------------------------------


def normalise_line_ends(data: bytes) -> bytes:
    """CRLF and lone CR become LF (the three line ends SSE allows)."""
    if CR not in data:
        return data
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def event_data(event: bytes) -> bytes:
    """The data of one event (LF line ends): its `data:` lines without the one optional space, joined by LF."""
    if event.startswith(b"data:") and LF not in event:
        value = event[5:]
        return value[1:] if value.startswith(b" ") else value
    lines = []
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            value = line[5:]
            lines.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(lines)


def _decode(data: bytes) -> dict[str, Any] | None:
    try:
        parsed = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    return parsed if isinstance(parsed, dict) else None


def event_object(event: bytes) -> dict[str, Any] | None:
    """The JSON object an event carries; None for `[DONE]`, comments and anything that is not an object."""
    data = event_data(event).strip()
    if not data or data == DONE:
        return None
    return _decode(data)


def split_events(stream: bytes) -> list[bytes]:
    """The events of a whole stream, in order (line ends normalised, without their blank lines)."""
    return [event for event in normalise_line_ends(stream).split(EVENT_END) if event.strip(b"\n")]


def stream_payloads(stream: bytes) -> list[bytes]:
    """The data of every event of a whole stream that carries any, in order, without `[DONE]`."""
    payloads = []
    for event in normalise_line_ends(stream).split(EVENT_END):
        one_line = event.startswith(b"data: ") and LF not in event  # vLLM's own shape, read without a split
        data = event[6:] if one_line else event_data(event.strip(b"\n")).strip()
        if data and data != DONE:
            payloads.append(data)
    return payloads


def stream_objects(stream: bytes) -> Iterator[dict[str, Any]]:
    """The JSON object of every event of a whole stream, in order."""
    for data in stream_payloads(stream):
        parsed = _decode(data)
        if parsed is not None:
            yield parsed


# -- what events mean ---------------------------------------------------------------------------------


def has_content(chunk: dict[str, Any]) -> bool:
    """Generated content: a non-empty text, content or reasoning string, a tool call, or a Responses delta."""
    choices = chunk.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if isinstance(choice, dict) and _choice_has_content(choice):
                return True
    delta = chunk.get("delta")
    return isinstance(delta, str) and delta != ""


def _choice_has_content(choice: dict[str, Any]) -> bool:
    text = choice.get("text")
    if isinstance(text, str) and text:
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    for key in DELTA_CONTENT_KEYS:
        value = delta.get(key)
        if isinstance(value, str) and value:
            return True
    calls = delta.get("tool_calls")
    return isinstance(calls, list) and len(calls) > 0


def is_final_usage(chunk: dict[str, Any]) -> bool:
    """The event that closes a stream with its usage: an empty-choices chunk, or Responses' completed event."""
    if chunk.get("type") == RESPONSES_COMPLETED:
        return True
    return is_usage_chunk(chunk)


def is_usage_chunk(chunk: dict[str, Any]) -> bool:
    """A chat/completions chunk that only carries usage (the one stripped when the client did not ask)."""
    choices = chunk.get("choices")
    return isinstance(chunk.get("usage"), dict) and isinstance(choices, list) and not choices


def text_pieces(chunk: dict[str, Any]) -> list[str]:
    """Generated text in a chunk: completions `text`, chat `delta.content`, Responses output-text deltas."""
    pieces = []
    choices = chunk.get("choices")
    if isinstance(choices, list):
        for choice in choices:
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            piece = choice.get("text")
            if not isinstance(piece, str):
                piece = delta.get("content") if isinstance(delta, dict) else None
            if isinstance(piece, str):
                pieces.append(piece)
    if chunk.get("type") == RESPONSES_TEXT_DELTA and isinstance(chunk.get("delta"), str):
        pieces.append(chunk["delta"])
    return pieces


class _TextDelta(msgspec.Struct):
    content: Any = None


class _TextChoice(msgspec.Struct):
    text: Any = None
    delta: _TextDelta | None = None


class _TextChunk(msgspec.Struct):
    """Only the fields generated text is read from; msgspec skips the rest without building them."""

    choices: list[_TextChoice] | None = None
    type: Any = None
    delta: Any = None


_TEXT_CHUNKS = msgspec.json.Decoder(list[_TextChunk])


def stream_text(stream: bytes) -> str:
    """The generated text of a whole stream (see `text_pieces`), read with one typed decode when it can be."""
    try:
        chunks = _TEXT_CHUNKS.decode(b"[" + b",".join(stream_payloads(stream)) + b"]")
    except (msgspec.DecodeError, RecursionError):  # some event is not a chunk object: read them one by one
        return "".join(piece for chunk in stream_objects(stream) for piece in text_pieces(chunk))
    return "".join(piece for chunk in chunks for piece in _typed_pieces(chunk))


def _typed_pieces(chunk: _TextChunk) -> list[str]:
    pieces = []
    for choice in chunk.choices or ():
        piece = choice.text if isinstance(choice.text, str) else (
            choice.delta.content if choice.delta is not None else None)
        if isinstance(piece, str):
            pieces.append(piece)
    if chunk.type == RESPONSES_TEXT_DELTA and isinstance(chunk.delta, str):
        pieces.append(chunk.delta)
    return pieces


def first_outcome(region: bytes) -> Literal["content", "error"] | None:
    """Among the complete events of a stream's first bytes: whether generated content or an error event comes
    first, or None while neither has. (The miss path screens a stream read by read with `OutcomeScreen`.)"""
    normalised = normalise_line_ends(region)
    end = normalised.rfind(EVENT_END)
    return events_outcome(normalised[: end + len(EVENT_END)]) if end >= 0 else None


def events_outcome(complete: bytes) -> Literal["content", "error"] | None:
    """`first_outcome` of complete events (line ends normalised)."""
    for event in complete.split(EVENT_END):
        parsed = event_object(event) if event.strip(b"\n") else None
        if parsed is None:
            continue
        if isinstance(parsed.get("error"), dict) or parsed.get("type") == "error":
            return "error"
        if has_content(parsed):
            return "content"
    return None


class OutcomeScreen:
    """`first_outcome` of a stream fed read by read, in time linear in its length: each event is read once, when
    it is complete, where calling `first_outcome` on everything so far after each read reads every event again
    (64 KiB of ten-byte events, one per read, took 21 s of the event loop that way)."""

    __slots__ = ("_after_cr", "_open")

    def __init__(self) -> None:
        self._open = bytearray()  # normalised bytes after the last complete event
        self._after_cr = False  # the last read ended with CR: a LF that opens the next one is the same line end

    def feed(self, data: bytes) -> Literal["content", "error"] | None:
        if self._after_cr and data.startswith(b"\n"):
            data = data[1:]
        self._after_cr = data.endswith(b"\r")
        start = max(0, len(self._open) - 1)  # an event end may begin with the last byte already held
        self._open += normalise_line_ends(data)
        end = self._open.rfind(EVENT_END, start)
        if end < 0:
            return None
        complete = bytes(self._open[: end + len(EVENT_END)])
        del self._open[: end + len(EVENT_END)]
        return events_outcome(complete)


def _may_name_usage(event: bytes) -> bool:
    # Integer membership is a memchr: far cheaper than a bytes search, and most events have no backslash.
    return event.find(USAGE_WORD) >= 0 or (BACKSLASH in event and event.find(ESCAPE) >= 0)


# -- the relay's watch ---------------------------------------------------------------------------------


class StreamWatch:
    """Feed it upstream chunks in order; it returns the bytes to pass on to the client."""

    def __init__(self, strip_usage: bool) -> None:
        self.strip_usage = strip_usage
        self.content_seen = False
        self.usage: Usage | None = None
        # Bytes of an event that is not complete yet (line ends normalised), grown in place: an event that arrives a
        # few bytes per read is searched and copied once, not once per read (which took 17 s for 256 KiB).
        self._tail = bytearray()
        self._skip_lf = False
        self._unread = b""  # inside an event past MAX_OPEN_EVENT_BYTES: its last byte passed on (LF or not)
        self.events_unread = 0
        # Content seen, no `_tail`, `_skip_lf` or `_unread`: one test, not four, on the fast path of every event. Set
        # at the end of each slow `feed`; anything else only moves the state towards it (content seen, a tail
        # flushed), and a stale False only sends one chunk down the slow path, which answers the same.
        self._plain = False

    def feed(self, chunk: bytes) -> tuple[bytes, bool]:
        """(bytes to forward, whether this chunk completed the first event with generated content)."""
        # The fast path, run per streamed event. Its tests are written in their cheapest forms on 3.11, measured
        # under callgrind on a 170-byte event: `chunk[-2:] == EVENT_END` (~780 instructions) rather than
        # `chunk.endswith(EVENT_END)` (~990: a varargs call that parses its arguments), and
        # `chunk.partition(USAGE_WORD)[1]` (b"" when the word is absent; a one-argument call, ~1,050) rather than
        # `chunk.find(USAGE_WORD) < 0` (~1,500). The two memchr tests go first: they are the cheap ones.
        if (self._plain and chunk[-2:] == EVENT_END and BACKSLASH not in chunk and CR not in chunk
                and not chunk.partition(USAGE_WORD)[1]):
            return chunk, False  # whole LF-only events after the first content, none of which can name usage
        forward, first = self._feed(chunk)
        self._plain = self.content_seen and not self._tail and not self._skip_lf and not self._unread
        return forward, first

    def _feed(self, chunk: bytes) -> tuple[bytes, bool]:
        data = chunk
        if self._skip_lf:  # the last chunk ended in CR: an LF first here is the rest of that CRLF
            self._skip_lf = False
            if data[:1] == b"\n":
                data = data[1:]
        if CR in data:
            self._skip_lf = data.endswith(b"\r")  # the tail never holds a CR: its line ends are normalised
            data = normalise_line_ends(data)
        if self._unread:
            return self._pass_unread(chunk, data)
        return self._events(chunk, data)

    def _events(self, chunk: bytes, data: bytes) -> tuple[bytes, bool]:
        """`feed` of normalised `data` outside an unread event."""
        tail = self._tail
        if tail:
            start = len(tail) - 1  # the tail holds no event end; one may begin with its last byte
            tail += data
            end = tail.rfind(EVENT_END, start)
            if end < 0:
                return self._still_open(chunk), False
            cut = end + len(EVENT_END)
            complete = bytes(tail[:cut])
            del tail[:cut]
        else:
            end = data.rfind(EVENT_END)
            cut = end + len(EVENT_END) if end >= 0 else 0
            complete = data[:cut]
            if cut < len(data):
                tail += data[cut:]
                if not complete:
                    return self._still_open(chunk), False
        if not complete or (self.content_seen and complete.find(USAGE_WORD) < 0
                            and (BACKSLASH not in complete or complete.find(ESCAPE) < 0)):
            return (complete if self.strip_usage else chunk), False  # the common case, kept inline
        complete, first = self._scan(complete)
        return (complete if self.strip_usage else chunk), first

    def _still_open(self, chunk: bytes) -> bytes:
        """What to pass on of a read that completed no event: nothing while stripping (the event is held until it
        is complete), unless it has grown past MAX_OPEN_EVENT_BYTES: then it is passed on, unread, to its end."""
        tail = self._tail
        if len(tail) <= MAX_OPEN_EVENT_BYTES:
            return b"" if self.strip_usage else chunk
        self.events_unread += 1
        self._unread = bytes(tail[-1:])
        held = bytes(tail)
        tail.clear()
        return held if self.strip_usage else chunk

    def _pass_unread(self, chunk: bytes, data: bytes) -> tuple[bytes, bool]:
        """A read inside an event passed on unread: on, up to the event's end; what follows is read again."""
        probe = self._unread + data
        end = probe.find(EVENT_END)
        if end < 0:
            self._unread = data[-1:] or self._unread
            return (data if self.strip_usage else chunk), False
        cut = end + len(EVENT_END) - len(self._unread)  # just after the event's end, in `data`
        self._unread = b""
        forward, first = self._events(chunk, data[cut:])
        return (data[:cut] + forward if self.strip_usage else chunk), first

    def flush(self) -> bytes:
        """Whatever is left at the end of the stream (a final event without its blank line)."""
        rest = bytes(self._tail)
        self._tail.clear()
        if not rest.strip(b"\r\n"):
            return rest if self.strip_usage else b""
        kept, _ = self._scan(normalise_line_ends(rest).rstrip(b"\n") + EVENT_END)
        return kept if self.strip_usage else b""

    def _scan(self, complete: bytes) -> tuple[bytes, bool]:
        """Look at each complete event; returns the events to forward and whether content first appeared."""
        first = False
        kept: list[bytes] = []
        cut_any = False
        for event in complete.split(EVENT_END)[:-1]:
            names_usage = _may_name_usage(event)
            if not self.content_seen and not names_usage and COMPACT_CONTENT.search(event) is not None:
                self.content_seen = first = True  # vLLM's own style, found without decoding
                kept.append(event + EVENT_END)
                continue
            parsed = event_object(event) if not self.content_seen or names_usage else None
            if parsed is not None:
                if not self.content_seen and has_content(parsed):
                    self.content_seen = first = True
                if is_final_usage(parsed):
                    self.usage = usage_from_body(parsed) or self.usage
                    if self.strip_usage and is_usage_chunk(parsed):
                        cut_any = True
                        continue
            kept.append(event + EVENT_END)
        return (b"".join(kept) if cut_any else complete), first


def stream_usage(stream: bytes) -> Usage | None:
    """Usage of a whole SSE stream: its last event that carries usage (the final one when usage is continuous)."""
    for event in reversed(split_events(stream)):
        if _may_name_usage(event):
            parsed = event_object(event)
            usage = usage_from_body(parsed) if parsed is not None else None
            if usage is not None:
                return usage
    return None
