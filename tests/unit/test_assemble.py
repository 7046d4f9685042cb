"""The stream assembler (tenants with `measure_ttft: true`) on real vLLM 0.25.0 streams, with hand-read oracles."""

from __future__ import annotations

from pathlib import Path

from gateway.proxy.assemble import StreamAssembler

HTTP = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "http"


def sse_body(name: str) -> bytes:
    """The captured body after the status line, the headers line and the blank line."""
    return (HTTP / name).read_bytes().split(b"\n\n", 1)[1]


def assembled(name: str, chat: bool, piece: int = 0) -> tuple[int, dict[str, object]]:
    assembler = StreamAssembler(chat=chat)
    body = sse_body(name)
    step = piece or len(body)
    for start in range(0, len(body), step):
        assembler.feed(body[start:start + step])
    return assembler.result()


def test_a_chat_stream_becomes_one_chat_completion() -> None:
    status, reply = assembled("offload_stream_chat.sse.txt", chat=True)
    assert status == 200
    assert reply["object"] == "chat.completion"
    assert reply["id"] == "chatcmpl-b37bb541eab178a9"
    # read off the capture by hand: the deltas "", " Multi", "MultiplyMultiply", " PRNG", "Either", " Binary"
    assert reply["choices"] == [{"index": 0, "message": {"role": "assistant",
                                                          "content": " MultiMultiplyMultiply PRNGEither Binary"},
                                 "logprobs": None, "finish_reason": "length"}]
    assert reply["usage"] == {"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5,
                              "prompt_tokens_details": {"cached_tokens": 0}}


def test_a_completion_stream_becomes_one_text_completion_whatever_the_chunking() -> None:
    whole = assembled("offload_stream_completion.sse.txt", chat=False)
    for piece in (1, 7, 64):
        assert assembled("offload_stream_completion.sse.txt", chat=False, piece=piece) == whole
    status, reply = whole
    assert status == 200
    assert reply["object"] == "text_completion"
    assert reply["choices"] == [{"index": 0, "text": "1100 to1100 to1100 to", "logprobs": None,
                                 "finish_reason": "length", "stop_reason": None}]
    assert reply["usage"] == {"prompt_tokens": 6, "total_tokens": 12, "completion_tokens": 6,
                              "prompt_tokens_details": {"cached_tokens": 0}}


def test_an_error_event_in_the_stream_is_returned_as_an_upstream_error() -> None:
    assembler = StreamAssembler(chat=False)
    assembler.feed(b'data: {"choices":[{"index":0,"text":"a"}]}\n\n')
    assembler.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n')
    assert assembler.result() == (500, {"error": {"message": "boom", "code": 500}})


def test_choices_are_kept_apart_by_index_and_ordered() -> None:
    assembler = StreamAssembler(chat=False)
    assembler.feed(b'data: {"choices":[{"index":1,"text":"b1"},{"index":0,"text":"a1"}]}\n\n')
    assembler.feed(b'data: {"choices":[{"index":0,"text":"a2","finish_reason":"stop"}]}\n\n')
    assembler.feed(b'data: {"choices":[{"index":1,"text":"b2","finish_reason":"length"}]}\n\ndata: [DONE]\n\n')
    status, reply = assembler.result()
    assert status == 200
    choices = reply["choices"]
    assert isinstance(choices, list)
    assert [(c["index"], c["text"], c["finish_reason"]) for c in choices] == [(0, "a1a2", "stop"),
                                                                             (1, "b1b2", "length")]


def test_an_empty_stream_gives_an_empty_reply_not_an_error() -> None:
    status, reply = StreamAssembler(chat=True).result()
    assert status == 200
    assert reply["choices"] == [] and reply["usage"] is None
