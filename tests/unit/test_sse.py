"""The stream watch on captured vLLM streams: first content, usage, and stripping usage."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.proxy.sse import StreamWatch, Usage, stream_usage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "http"


def captured_body(name: str) -> bytes:
    raw = (FIXTURES / name).read_bytes()
    return raw.split(b"\n\n", 1)[1]


def feed_all(watch: StreamWatch, body: bytes, size: int) -> tuple[bytes, int | None]:
    out, first_at = b"", None
    for offset in range(0, len(body), size):
        forward, first = watch.feed(body[offset : offset + size])
        if first and first_at is None:
            first_at = offset
        out += forward
    return out + watch.flush(), first_at


@pytest.mark.parametrize("name", ["offload_stream_chat.sse.txt", "offload_stream_completion.sse.txt"])
@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_usage_found_and_bytes_unchanged_when_client_asked(name: str, size: int) -> None:
    body = captured_body(name)
    out, first_at = feed_all(StreamWatch(strip_usage=False), body, size)
    assert out == body
    assert first_at is not None


@pytest.mark.parametrize("name", ["offload_stream_chat.sse.txt", "control_stream_completion.sse.txt"])
@pytest.mark.parametrize("size", [1, 13, 100_000])
def test_usage_event_removed_when_client_did_not_ask(name: str, size: int) -> None:
    body = captured_body(name)
    watch = StreamWatch(strip_usage=True)
    out, _ = feed_all(watch, body, size)
    assert b'"usage"' not in out
    assert out.endswith(b"data: [DONE]\n\n")
    assert watch.usage is not None and watch.usage.prompt_tokens > 0
    kept = [event for event in body.split(b"\n\n") if b'"usage"' not in event]
    assert out == b"\n\n".join(kept)


def test_chat_role_chunk_is_not_content() -> None:
    watch = StreamWatch(strip_usage=False)
    role = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
    assert watch.feed(role)[1] is False
    assert watch.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')[1] is True
    assert watch.feed(b'data: {"choices":[{"index":0,"delta":{"content":"!"}}]}\n\n')[1] is False


def test_cached_tokens_read_from_usage_chunk() -> None:
    watch = StreamWatch(strip_usage=False)
    watch.feed(b'data: {"choices":[],"usage":{"prompt_tokens":8000,"total_tokens":8016,'
               b'"completion_tokens":16,"prompt_tokens_details":{"cached_tokens":7984}}}\n\n')
    assert watch.usage is not None
    assert (watch.usage.prompt_tokens, watch.usage.cached_tokens) == (8000, 7984)


def test_responses_api_completed_event_usage() -> None:
    watch = StreamWatch(strip_usage=False)
    watch.feed(b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"x"}\n\n')
    watch.feed(b'event: response.completed\ndata: {"type":"response.completed","response":{"usage":'
               b'{"input_tokens":40,"output_tokens":2,"input_tokens_details":{"cached_tokens":32}}}}\n\n')
    assert watch.content_seen
    assert watch.usage is not None and watch.usage.cached_tokens == 32


@pytest.mark.parametrize("name", ["offload_stream_chat.sse.txt", "offload_stream_completion.sse.txt",
                                  "control_stream_chat.sse.txt", "control_stream_completion.sse.txt"])
def test_whole_stream_usage_matches_the_watch(name: str) -> None:
    body = captured_body(name)
    watch = StreamWatch(strip_usage=False)
    feed_all(watch, body, 64)
    assert watch.usage is not None
    assert stream_usage(body) == watch.usage


def test_whole_stream_usage_takes_the_last_usage_event() -> None:
    continuous = (b'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}\n\n'
                  b'data: {"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,'
                  b'"prompt_tokens_details":{"cached_tokens":8}}}\n\ndata: [DONE]\n\n')
    assert stream_usage(continuous) == Usage(prompt_tokens=10, cached_tokens=8, completion_tokens=2)
    assert stream_usage(b'data: {"choices":[{"text":"a"}]}\n\ndata: [DONE]\n\n') is None
