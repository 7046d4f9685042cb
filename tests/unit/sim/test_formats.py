"""Response bodies and SSE streams (pure). The oracle is vLLM 0.25.0 itself: given a captured response's id,
timestamp, fingerprint, texts and usage, the simulator's stream must be the captured body byte for byte, and its
non-stream bodies the captured JSON key for key in order."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.formats import DONE, ChatStream, CompletionStream, ResponseMeta, Usage, body_for, chunk_stream, sse
from gateway.sim.protocol import GenRequest, Kind, ParseContext, parse_generation
from gateway.sim.responses_api import ResponsesStream, response_body, usage_dict
from tests.unit.sim.captures import captured_bodies, http_capture

ANY_BODY = {"model": "m", "prompt": "x", "messages": [{"role": "user", "content": "x"}], "input": "x"}


def generation(kind: Kind, base_id: str = "abc", **body: Any) -> GenRequest:
    return parse_generation(kind, {**ANY_BODY, **body}, ParseContext("m", 16384, 16, base_id, False))


def meta(kind: Kind, base_id: str = "abc", created: int = 1795954067, fingerprint: str = "vllm-0.25.0-x",
         **body: Any) -> ResponseMeta:
    return ResponseMeta(generation(kind, base_id, **body), created, fingerprint)


def data_events(body: str) -> list[str]:
    return [block[len("data: "):] for block in body.split("\n\n") if block.startswith("data: ")]


def ordered(value: Any) -> str:
    """A JSON text that keeps key order, so two values compare equal only with the same order at every depth."""
    return json.dumps(value, ensure_ascii=False)


@pytest.mark.parametrize(
    ("capture", "kind"),
    [("control_stream_chat.sse.txt", Kind.CHAT), ("control_stream_completion.sse.txt", Kind.COMPLETION),
     ("offload_stream_chat.sse.txt", Kind.CHAT), ("offload_stream_completion.sse.txt", Kind.COMPLETION)],
)
def test_streams_are_the_captured_bytes(capture: str, kind: Kind) -> None:
    body = http_capture(capture).split("\n\n", 1)[1]
    events = data_events(body)
    first, usage_chunk = json.loads(events[0]), json.loads(events[-2])
    stream = chunk_stream(meta(kind, first["id"].split("-", 1)[1], first["created"],
                               usage_chunk["system_fingerprint"], stream=True,
                               stream_options={"include_usage": True}))
    choices = [json.loads(event)["choices"][0] for event in events[:-2]]
    texts = [c["text"] for c in choices] if kind is Kind.COMPLETION else [c["delta"]["content"] for c in choices[1:]]
    counts = usage_chunk["usage"]
    usage = Usage(counts["prompt_tokens"], counts["completion_tokens"],
                  counts["prompt_tokens_details"]["cached_tokens"])
    produced = stream.opening() + stream.first()
    produced += b"".join(stream.token(text, index == len(texts) - 1) for index, text in enumerate(texts))
    produced += stream.closing(usage, "".join(texts))
    assert produced.decode() == body


@pytest.mark.parametrize(("case", "kind"), [("completion_basic", Kind.COMPLETION), ("chat_basic", Kind.CHAT),
                                            ("completion_cache_salt", Kind.COMPLETION),
                                            ("chat_cache_salt", Kind.CHAT)])
def test_bodies_are_the_captured_json_in_order(case: str, kind: Kind) -> None:
    captured = captured_bodies()[case]["body"]
    choice = captured["choices"][0]
    text = choice["text"] if kind is Kind.COMPLETION else choice["message"]["content"]
    counts = captured["usage"]
    usage = Usage(counts["prompt_tokens"], counts["completion_tokens"],
                  counts["prompt_tokens_details"]["cached_tokens"])
    produced = body_for(meta(kind, captured["id"].split("-", 1)[1], captured["created"],
                             captured["system_fingerprint"]), text, usage)
    assert ordered(produced) == ordered(captured)


def test_usage_in_a_stream_and_in_a_body() -> None:
    usage = Usage(prompt_tokens=10, completion_tokens=3, cached_tokens=8)
    assert ordered(usage.stream_dict()) == ordered({"prompt_tokens": 10, "total_tokens": 13, "completion_tokens": 3,
                                                    "prompt_tokens_details": {"cached_tokens": 8}})
    assert usage.body_dict()["prompt_tokens_details"] == {"cached_tokens": 8, "multimodal_tokens": None}
    assert "multimodal_tokens" not in usage.stream_dict()["prompt_tokens_details"]  # a fresh dict each time


def test_without_include_usage_a_stream_ends_with_done_only() -> None:
    for kind in (Kind.COMPLETION, Kind.CHAT):
        stream = chunk_stream(meta(kind, stream=True))
        assert stream.closing(Usage(1, 1, 0), "t") == DONE


def test_a_stream_error_is_an_error_event_then_done() -> None:
    produced = chunk_stream(meta(Kind.CHAT, stream=True)).error("it broke")
    assert produced == (b'data: {"error":{"message":"it broke","type":"InternalServerError","param":null,'
                        b'"code":500}}\n\ndata: [DONE]\n\n')


def test_the_completion_stream_has_no_first_event_and_chat_opens_with_the_role() -> None:
    assert CompletionStream(meta(Kind.COMPLETION)).first() == b""
    (role,) = data_events(ChatStream(meta(Kind.CHAT)).first().decode())
    assert json.loads(role)["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]
    assert chunk_stream(meta(Kind.CHAT)).opening() == b""


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=20), last=st.booleans())
def test_any_token_text_is_valid_json_in_either_stream(text: str, last: bool) -> None:
    for stream, path in ((CompletionStream(meta(Kind.COMPLETION)), ("text",)),
                         (ChatStream(meta(Kind.CHAT)), ("delta", "content"))):
        (event,) = data_events(stream.token(text, last).decode())
        choice = json.loads(event)["choices"][0]
        value = choice[path[0]] if len(path) == 1 else choice[path[0]][path[1]]
        assert value == text
        assert choice["finish_reason"] == ("length" if last else None)


def test_sse_encodes_compact_json() -> None:
    assert sse({"a": [1, None], "b": "é"}) == 'data: {"a":[1,null],"b":"é"}\n\n'.encode()


# --- the Responses API ---------------------------------------------------------------------------------------


def responses_events(produced: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in produced.decode().split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        out.append((event_line[len("event: "):], json.loads(data_line[len("data: "):])))
    return out


def test_a_responses_stream_is_numbered_and_typed() -> None:
    info = meta(Kind.RESPONSES, "r1", stream=True)
    stream = ResponsesStream(info)
    produced = stream.opening() + stream.first() + stream.token("a", False) + stream.token("b", True)
    produced += stream.closing(Usage(5, 2, 4), "ab")
    events = responses_events(produced)
    assert [kind for kind, _ in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert all(data["type"] == kind for kind, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(10))
    assert [data["delta"] for kind, data in events if kind.endswith(".delta")] == ["a", "b"]
    completed = events[-1][1]["response"]
    assert (completed["id"], completed["status"]) == ("resp_r1", "completed")
    assert completed["output"][0]["id"] == "msg_r1"
    assert completed["output"][0]["content"][0]["text"] == "ab"
    assert completed["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 4},
                                  "output_tokens": 2, "output_tokens_details": {"reasoning_tokens": 0},
                                  "total_tokens": 7}
    assert events[0][1]["response"]["status"] == "in_progress" and events[0][1]["response"]["output"] == []


def test_a_responses_stream_error_continues_the_numbering_and_sends_no_done() -> None:
    stream = ResponsesStream(meta(Kind.RESPONSES))
    produced = stream.opening() + stream.error("bad")
    events = responses_events(produced)
    assert events[-1][0] == "error"
    assert events[-1][1]["sequence_number"] == 2
    assert events[-1][1]["error"]["message"] == "bad"
    assert b"[DONE]" not in produced


def test_a_response_body_echoes_the_request() -> None:
    info = meta(Kind.RESPONSES, "q", instructions="be brief", metadata={"k": "v"}, top_p=0.5, user="u",
                max_output_tokens=9, temperature=0.2)
    body = response_body(info, "done", Usage(3, 1, 0))
    assert (body["instructions"], body["metadata"], body["top_p"], body["user"]) == ("be brief", {"k": "v"}, 0.5,
                                                                                      "u")
    assert (body["max_output_tokens"], body["temperature"], body["model"]) == (9, 0.2, "m")
    assert body["output"][0]["status"] == "completed" and body["usage"] == usage_dict(Usage(3, 1, 0))
    pending = response_body(info, None, None)
    assert (pending["status"], pending["output"], pending["usage"]) == ("in_progress", [], None)


def test_body_for_chooses_by_kind() -> None:
    usage = Usage(1, 1, 0)
    assert body_for(meta(Kind.CHAT), "t", usage)["object"] == "chat.completion"
    assert body_for(meta(Kind.COMPLETION), "t", usage)["object"] == "text_completion"
    assert isinstance(chunk_stream(meta(Kind.COMPLETION)), CompletionStream)
