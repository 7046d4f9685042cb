"""Formats of the simulated server compared with the vLLM 0.25.0 captures, through httpx and the openai client."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai

from tests.procs import ServerProcess
from tests.sim.helpers import MODEL, capture, captured_responses, captured_sse, complete, sse_data, words


def stream_events(base_url: str, path: str, body: dict[str, Any]) -> tuple[httpx.Response, list[Any]]:
    with httpx.stream("POST", f"{base_url}{path}", json=body, timeout=30) as reply:
        text = reply.read().decode()
    return reply, sse_data(text)


def key_shapes(events: list[Any]) -> list[Any]:
    """Each event's keys and its first choice's keys (the parts whose shape must match)."""
    shapes: list[Any] = []
    for event in events:
        if event == "[DONE]":
            shapes.append(event)
            continue
        choices = event.get("choices") or [{}]
        shapes.append((sorted(event), sorted(choices[0]), sorted(choices[0].get("delta", {}))))
    return shapes


def test_completion_stream_matches_capture(sim: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": words(40), "max_tokens": 6, "stream": True,
            "stream_options": {"include_usage": True}}
    reply, events = stream_events(sim.url, "/v1/completions", body)
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert key_shapes(events) == key_shapes(captured_sse("control_stream_completion.sse.txt"))
    assert [e["choices"][0]["finish_reason"] for e in events[:6]] == [None] * 5 + ["length"]
    usage = events[-2]["usage"]
    assert usage == {"prompt_tokens": 40, "total_tokens": 46, "completion_tokens": 6,
                     "prompt_tokens_details": {"cached_tokens": 0}}
    assert events[-2]["system_fingerprint"].startswith("vllm-0.25.0-")


def test_chat_stream_matches_capture(sim: ServerProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": words(20)}], "max_tokens": 5,
            "stream": True, "stream_options": {"include_usage": True}}
    _, events = stream_events(sim.url, "/v1/chat/completions", body)
    captured = captured_sse("control_stream_chat.sse.txt")
    assert key_shapes(events) == key_shapes(captured)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"] == [] and set(events[-2]["usage"]) == set(captured[-2]["usage"])


def test_stream_without_include_usage_has_no_usage_chunk(sim: ServerProcess) -> None:
    body = {"model": MODEL, "prompt": words(20), "max_tokens": 3, "stream": True}
    _, events = stream_events(sim.url, "/v1/completions", body)
    assert len(events) == 4 and events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])


def test_nonstream_bodies_match_capture(sim: ServerProcess) -> None:
    captured = captured_responses()
    completion = complete(sim.url, words(30), max_tokens=8)
    chat = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30, json={
        "model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}).json()
    for mine, theirs in ((completion, captured["completion_basic"]["body"]),
                         (chat, captured["chat_basic"]["body"])):
        assert list(mine) == list(theirs)
        assert list(mine["choices"][0]) == list(theirs["choices"][0])
        assert mine["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "multimodal_tokens": None}
        assert mine["kv_transfer_params"] is None
    assert list(chat["choices"][0]["message"]) == list(captured["chat_basic"]["body"]["choices"][0]["message"])


def test_request_id_header_names_the_response(sim: ServerProcess) -> None:
    completion = httpx.post(f"{sim.url}/v1/completions", headers={"X-Request-Id": "rid-1"}, timeout=30,
                            json={"prompt": words(20), "max_tokens": 2}).json()
    chat = httpx.post(f"{sim.url}/v1/chat/completions", headers={"X-Request-Id": "rid-2"}, timeout=30,
                      json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}).json()
    assert (completion["id"], chat["id"]) == ("cmpl-rid-1", "chatcmpl-rid-2")


def test_openai_client_streams_and_completes(sim: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    prompt = words(64)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    final = client.completions.create(model=MODEL, prompt=prompt, max_tokens=7, temperature=0)
    assert final.choices[0].text == streamed and len(streamed) == 7
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens == 64
    assert final.usage is not None and final.usage.prompt_tokens_details is not None
    assert final.usage.prompt_tokens_details.cached_tokens == 48


def test_openai_client_chat_and_responses(sim: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": words(30)}]
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5, stream=True)
    deltas = [c.choices[0].delta.content for c in stream if c.choices]
    assert deltas[0] == "" and len("".join(d or "" for d in deltas)) == 5
    response = client.responses.create(model=MODEL, input=words(30), max_output_tokens=6)
    assert len(response.output_text) == 6 and response.usage is not None
    events = list(client.responses.create(model=MODEL, input=words(30), max_output_tokens=3, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"


def test_responses_stream_has_event_lines_and_no_done(sim: ServerProcess) -> None:
    with httpx.stream("POST", f"{sim.url}/v1/responses", json={"input": "hi", "stream": True, "max_output_tokens": 2},
                      timeout=30) as reply:
        text = reply.read().decode()
    blocks = [b for b in text.split("\n\n") if b]
    assert all(b.startswith("event: ") and "\ndata: " in b for b in blocks)
    assert "[DONE]" not in text


def test_probes_match_capture(sim: ServerProcess) -> None:
    health = httpx.get(f"{sim.url}/health")
    assert (health.status_code, health.content) == (200, b"")
    assert httpx.get(f"{sim.url}/ping").status_code == 200
    assert httpx.get(f"{sim.url}/version").json() == {"version": "0.25.0"}
    assert set(httpx.get(f"{sim.url}/load").json()) == {"server_load"}
    models = httpx.get(f"{sim.url}/v1/models").json()
    captured = json.loads(capture("http/offload_GET_v1_models.txt").read_text().split("\n\n", 1)[1])
    assert list(models) == list(captured) and list(models["data"][0]) == list(captured["data"][0])
    assert models["data"][0]["id"] == MODEL


def test_tokenize_detokenize_and_embeddings(sim: ServerProcess) -> None:
    tokens = httpx.post(f"{sim.url}/tokenize", json={"prompt": "héllo"}).json()
    assert tokens["count"] == 6 and tokens["max_model_len"] == 16384
    assert httpx.post(f"{sim.url}/detokenize", json={"tokens": tokens["tokens"]}).json() == {"prompt": "héllo"}
    client = openai.OpenAI(base_url=f"{sim.url}/v1", api_key="unused", max_retries=0)
    first = client.embeddings.create(model=MODEL, input=["a b", "c"])
    again = client.embeddings.create(model=MODEL, input="a b", encoding_format="float")
    assert len(first.data) == 2 and first.data[0].embedding == again.data[0].embedding
