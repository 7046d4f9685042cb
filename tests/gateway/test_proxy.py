"""The proxy path through a real gateway to a real simulator, driven by the official openai client."""

from __future__ import annotations

import hashlib
import json
import socket
import time

import httpx
import openai
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, Stack
from tests.harness import expected_salt
from tests.sim.helpers import poll

LONG_PROMPT = " ".join(f"word{index}" for index in range(600))


def openai_client(stack: Stack, tenant: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=stack.key(tenant), max_retries=0, timeout=30)


def raw_post(stack: Stack, tenant: str, path: str, body: object, **headers: str) -> httpx.Response:
    with stack.client(tenant) as client:
        return client.post(path, json=body, headers=headers)


def completion(stack: Stack, tenant: str, prompt: str, **extra: object) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}
    return raw_post(stack, tenant, "/v1/completions", body)


def test_chat_non_streaming_with_openai_client(stack: Stack) -> None:
    client = openai_client(stack, "acme")
    raw = client.chat.completions.with_raw_response.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": "hello there"}], max_tokens=5)
    reply = raw.parse()
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert raw.headers["x-kvgate-pool"] == "offload"
    assert float(raw.headers["x-kvgate-overhead-ms"]) >= 0
    request_id = raw.headers["x-request-id"]
    assert reply.id.endswith(request_id)
    seen = stack.sim_request(request_id)
    assert seen["cache_salt"] == expected_salt(stack.secret, "acme")
    assert not seen["stream_options_present"]


PAUSE_S = 2.0


def test_waiting_for_a_slow_client_s_body_is_not_counted_as_the_gateway_s_overhead(stack: Stack) -> None:
    """A client that stops half-way through its body: the gateway's wait for the rest is the client's upload, logged
    as `body_wait_ms`; the overhead header, log field and histogram keep the gateway's own time only."""
    body = json.dumps({"model": SIM_MODEL, "prompt": "an upload that stalls", "max_tokens": 2}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {stack.key('acme')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    overhead_sum = 'kvgate_overhead_seconds_sum{route="/v1/completions"}'
    with stack.client("ops") as client:
        summed_before = _value(client.get("/metrics").text, overhead_sum)
    with socket.create_connection(("127.0.0.1", stack.gateway.port), timeout=30) as sock:
        sock.sendall(head + body[:10])
        time.sleep(PAUSE_S)  # the fault injected: the client stalls mid-body (nothing here waits on the gateway)
        sock.sendall(body[10:])
        answer = b"".join(iter(lambda: sock.recv(65536), b""))
    status_line, *header_lines = answer.partition(b"\r\n\r\n")[0].decode("latin-1").split("\r\n")
    assert status_line.split(" ")[1] == "200"
    headers = dict(line.lower().split(": ", 1) for line in header_lines)
    entry = poll(lambda: next((json.loads(line) for line in stack.gateway.log_text().splitlines()
                               if headers["x-request-id"] in line and '"event":"request"' in line), None),
                 what="the request's log line")
    # The rest of the body left the client PAUSE_S after the head: the gateway cannot have had it sooner.
    assert entry["body_wait_ms"] >= PAUSE_S * 1000 / 2
    assert float(headers["x-kvgate-overhead-ms"]) < entry["body_wait_ms"]
    assert entry["overhead_ms"] < entry["body_wait_ms"]
    with stack.client("ops") as client:  # this module's requests are sequential: the sum grew by this one's
        summed = _value(client.get("/metrics").text, overhead_sum) - summed_before
    assert 0 < summed * 1000 < entry["body_wait_ms"]


def test_chat_streaming_with_openai_client_hides_usage_it_did_not_ask_for(stack: Stack) -> None:
    client = openai_client(stack, "acme")
    chunks = list(client.chat.completions.create(
        model=SIM_MODEL, messages=[{"role": "user", "content": "stream please"}], max_tokens=6, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert all(chunk.usage is None for chunk in chunks)
    assert all(chunk.choices for chunk in chunks)


def test_streaming_usage_is_kept_when_client_asked(stack: Stack) -> None:
    client = openai_client(stack, "acme")
    chunks = list(client.completions.create(
        model=SIM_MODEL, prompt="count with me", max_tokens=6, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    assert sum(1 for chunk in chunks if chunk.usage is not None) == 1


def test_stream_ends_with_done_and_gateway_sends_its_request_id(stack: Stack) -> None:
    body = {"model": SIM_MODEL, "prompt": "abc", "max_tokens": 3, "stream": True}
    with stack.client("acme") as client, client.stream("POST", "/v1/completions", json=body,
                                                      headers={"X-Request-Id": "client-chosen"}) as reply:
        text = b"".join(reply.iter_bytes()).decode()
        request_id = reply.headers["x-request-id"]
    assert text.endswith("data: [DONE]\n\n")
    assert request_id != "client-chosen"
    seen = stack.sim_request(request_id)
    assert seen["stream_options_present"] is True


def test_upstream_gets_the_pool_key_never_the_client_key(stack: Stack) -> None:
    reply = completion(stack, "acme", "keys")
    seen = stack.sim_request(reply.headers["x-request-id"])
    secrets = seen["credential_sha256"]
    assert isinstance(secrets, dict)
    assert secrets["authorization"] == hashlib.sha256(f"Bearer {UPSTREAM_KEY}".encode()).hexdigest()
    assert "x-api-key" not in secrets


def test_steering_headers_are_dropped_and_trace_headers_kept(stack: Stack) -> None:
    steering = {"X-Vllm-Priority": "-100", "X-data-parallel-rank": "3", "X-Session-ID": "s",
                "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    reply = raw_post(stack, "acme", "/v1/completions", {"model": SIM_MODEL, "prompt": "h", "max_tokens": 1},
                     **steering)
    headers = stack.sim_request(reply.headers["x-request-id"])["headers"]
    assert isinstance(headers, dict)
    assert {"x-vllm-priority", "x-data-parallel-rank", "x-session-id"}.isdisjoint(headers)
    assert headers["traceparent"] == steering["traceparent"]


def test_client_salt_is_rejected_for_reject_tenants(stack: Stack) -> None:
    before = len(stack.sim_requests())
    reply = completion(stack, "acme", "x", cache_salt="steal-another-tenant")
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "cache_salt"
    assert len(stack.sim_requests()) == before


def test_client_salt_is_replaced_for_replace_tenants(stack: Stack) -> None:
    reply = completion(stack, "beta", "x", cache_salt="steal-another-tenant")
    assert reply.status_code == 200
    assert stack.sim_request(reply.headers["x-request-id"])["cache_salt"] == expected_salt(stack.secret, "beta")


def test_per_user_salt(stack: Stack) -> None:
    reply = completion(stack, "gamma", "x", user="alice")
    assert stack.sim_request(reply.headers["x-request-id"])["cache_salt"] == expected_salt(
        stack.secret, "gamma", 1, "alice")


@pytest.mark.parametrize(
    ("client_params", "expected"),
    [(None, {"max_load_tokens": 4096, "max_offload_tokens": 1000}),
     ({"max_offload_tokens": 50}, {"max_load_tokens": 4096, "max_offload_tokens": 50}),
     ({"max_offload_tokens": 99999, "max_load_tokens": 0}, {"max_load_tokens": 0, "max_offload_tokens": 1000})],
)
def test_caps_clamp(stack: Stack, client_params: dict[str, int] | None, expected: dict[str, int]) -> None:
    extra = {} if client_params is None else {"kv_transfer_params": client_params}
    reply = completion(stack, "acme", "caps", **extra)
    assert reply.status_code == 200
    assert stack.sim_request(reply.headers["x-request-id"])["kv_transfer_params"] == expected


def test_foreign_transfer_params_are_400_and_not_forwarded(stack: Stack) -> None:
    before = len(stack.sim_requests())
    reply = completion(stack, "acme", "x", kv_transfer_params={"do_remote_prefill": True})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "kv_transfer_params.do_remote_prefill"
    assert len(stack.sim_requests()) == before


def test_tenant_isolation_of_cached_prefixes(stack: Stack) -> None:
    prompt = LONG_PROMPT + " isolation"
    first = completion(stack, "acme", prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    repeat = completion(stack, "acme", prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    other = completion(stack, "beta", prompt).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first == 0
    assert repeat > 0
    assert other == 0


def test_measure_ttft_assembles_a_non_streaming_reply(stack: Stack) -> None:
    client = openai_client(stack, "delta")
    raw = client.completions.with_raw_response.create(model=SIM_MODEL, prompt="assemble me", max_tokens=5,
                                                      temperature=0)
    reply = raw.parse()
    assert reply.object == "text_completion"
    assert reply.choices[0].text and reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 5
    seen = stack.sim_request(raw.headers["x-request-id"])
    assert seen["stream"] is True
    direct = completion(stack, "acme", "assemble me", max_tokens=5).json()
    assert reply.choices[0].text == direct["choices"][0]["text"]
    chat = client.chat.completions.create(model=SIM_MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_tokens=3)
    assert chat.object == "chat.completion" and chat.choices[0].message.content


def test_embeddings_models_tokenize_detokenize(stack: Stack) -> None:
    client = openai_client(stack, "acme")
    assert [model.id for model in client.models.list()] == [SIM_MODEL]
    embedding = client.embeddings.create(model=SIM_MODEL, input="vector me")
    assert len(embedding.data[0].embedding) > 0
    tokens = raw_post(stack, "acme", "/tokenize", {"model": SIM_MODEL, "prompt": "a b c"}).json()
    text = raw_post(stack, "acme", "/detokenize", {"model": SIM_MODEL, "tokens": tokens["tokens"]}).json()
    assert "a" in text["prompt"]


def test_responses_api_streams_through(stack: Stack) -> None:
    client = openai_client(stack, "acme")
    events = list(client.responses.create(model=SIM_MODEL, input="respond", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.completed"


def test_upstream_errors_pass_through_unchanged(stack: Stack) -> None:
    reply = completion(stack, "acme", "fail [[sim:status=500]]")
    assert reply.status_code == 500
    assert reply.json()["error"]["code"] == 500
    unknown = raw_post(stack, "acme", "/v1/completions", {"model": "nope", "prompt": "x"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["param"] == "model"


def test_failure_after_first_byte_ends_with_error_event_and_done(stack: Stack) -> None:
    body = {"model": SIM_MODEL, "prompt": "[[sim:drop-after=2]] go", "max_tokens": 10, "stream": True}
    with stack.client("acme") as client, client.stream("POST", "/v1/completions", json=body) as reply:
        assert reply.status_code == 200
        events = [event for event in b"".join(reply.iter_bytes()).decode().split("\n\n") if event]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))
    assert error["error"]["type"] == "upstream_error"
    assert sum(1 for event in events if '"text"' in event) == 2


def test_client_disconnect_cancels_the_upstream_request(stack: Stack) -> None:
    body = {"model": SIM_MODEL, "prompt": "long story", "max_tokens": 4000, "stream": True}
    with stack.client("acme") as client, client.stream("POST", "/v1/completions", json=body) as reply:
        request_id = reply.headers["x-request-id"]
        next(reply.iter_bytes())
    deadline = time.monotonic() + 20
    while stack.sim_request(request_id)["outcome"] == "in_progress" and time.monotonic() < deadline:
        time.sleep(0.05)  # polling the simulator's record until it settles
    assert stack.sim_request(request_id)["outcome"] == "aborted"


@pytest.mark.parametrize(
    ("content", "content_type", "status"),
    [(b"{not json", "application/json", 400), (b"[1, 2]", "application/json", 400),
     (b'{"model": "m"}', "text/plain", 415), (b"model=m", "application/x-www-form-urlencoded", 415)],
)
def test_bad_bodies_get_clear_errors(stack: Stack, content: bytes, content_type: str, status: int) -> None:
    with stack.client("acme") as client:
        reply = client.post("/v1/chat/completions", content=content, headers={"content-type": content_type})
    assert reply.status_code == status
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{stack.url}/livez").status_code == 200


def test_oversized_body_is_413(stack: Stack) -> None:
    huge = {"model": SIM_MODEL, "prompt": "x" * (11 * 1024 * 1024)}
    with stack.client("acme") as client:
        reply = client.post("/v1/completions", json=huge)
    assert reply.status_code == 413
    assert httpx.get(f"{stack.url}/livez").status_code == 200


def test_metrics_per_tenant(stack: Stack) -> None:
    prompt = LONG_PROMPT + " metrics"
    completion(stack, "acme", prompt)
    completion(stack, "acme", prompt)
    body = {"model": SIM_MODEL, "prompt": "ttft", "max_tokens": 3, "stream": True}
    with stack.client("acme") as client, client.stream("POST", "/v1/completions", json=body) as reply:
        b"".join(reply.iter_bytes())
    with stack.client("ops") as client:
        text = client.get("/metrics").text
    assert 'kvgate_requests_total{pool="offload",route="/v1/completions",status="200",tenant="acme"}' in text
    assert _value(text, 'kvgate_cached_prompt_tokens_total{pool="offload",tenant="acme"}') > 0
    assert _value(text, 'kvgate_prompt_tokens_total{pool="offload",tenant="acme"}') > 0
    assert _value(text, 'kvgate_ttft_seconds_count{pool="offload",route="/v1/completions",tenant="acme"}') >= 1
    assert _value(text, 'kvgate_overhead_seconds_count{route="/v1/completions"}') >= 1
    assert 'kvgate_policy_reloads_total{result="ok"}' in text
    assert 'tenant=""' not in text


def _value(text: str, series: str) -> float:
    """One series' value; 0.0 while it does not exist yet."""
    line = next((line for line in text.splitlines() if line.startswith(series + " ")), None)
    return float(line.rsplit(" ", 1)[1]) if line is not None else 0.0


def test_logs_never_contain_prompts_keys_or_salts(stack: Stack) -> None:
    marker = "confidential-prompt-marker"
    completion(stack, "acme", marker)
    log = stack.gateway.log_text()
    assert any(json.loads(line).get("event") == "request" for line in log.splitlines() if line.startswith("{"))
    assert marker not in log
    assert stack.secret not in log
    for tenant, key in stack.policy.keys.items():
        assert key not in log
        assert expected_salt(stack.secret, tenant) not in log
