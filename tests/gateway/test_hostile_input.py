"""Hostile and careless input against a served gateway: JSON shape bounds, identity-field lengths, credential
headers with conflicting or arbitrary bytes, admin query strings, compressed upstream bodies, and reports whose
store is killed under the gateway (503, never the last-resort 500: tests/unit/http/test_last_resort.py covers
that handler)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.proxy.smallcalls import SmallCalls, client_error, read_small
from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, standard_policy
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.ledger.redis_proc import RedisProcess
from tests.procs import ServerProcess, upstream_module
from tests.sim.helpers import metric_value, poll, sse_data

USER_HEADER = "x-end-user"


class Hostile:
    def __init__(self, gateway: ServerProcess, policy: PolicyDir) -> None:
        self.gateway = gateway
        self.policy = policy

    def post(self, tenant: str, body: bytes | object, path: str = "/v1/completions",
             headers: dict[str, str] | None = None) -> httpx.Response:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        all_headers = {**bearer(self.policy.keys[tenant]), "content-type": "application/json", **(headers or {})}
        return httpx.post(f"{self.gateway.url}{path}", content=content, headers=all_headers, timeout=30)

    def raw(self, request: bytes) -> tuple[int, bytes]:
        with socket.create_connection(("127.0.0.1", self.gateway.port), timeout=20) as sock:
            sock.sendall(request)
            chunks: list[bytes] = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
                if b"\r\n\r\n" in b"".join(chunks):
                    break
        head = b"".join(chunks)
        return int(head.split(b" ", 2)[1]), head


@pytest.fixture(scope="module")
def hostile(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    root = tmp_path_factory.mktemp("hostile")
    policy = standard_policy(root / "policies", sim.url)
    policy.add_tenant("hdr", cache={"isolation": "user"}, rollout={"user_header": USER_HEADER})
    policy.write()
    with run_gateway(policy.root, root / "gateway.log", new_secret(), {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield Hostile(gateway, policy)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def completion_with(extra: str) -> bytes:
    return b'{"model":"' + SIM_MODEL.encode() + b'","prompt":"hi","max_tokens":1,"extra":' + extra.encode() + b"}"


def error_of(reply: httpx.Response) -> dict[str, object]:
    error: dict[str, object] = reply.json()["error"]
    return error


@pytest.mark.parametrize("depth", [66, 3000, 200_000])
def test_deep_json_is_400(hostile: Hostile, depth: int) -> None:
    reply = hostile.post("acme", completion_with(nested(depth)))
    assert reply.status_code == 400
    assert "nests deeper" in str(error_of(reply)["message"])


def test_deep_json_on_a_validated_forward_route_is_400(hostile: Hostile) -> None:
    reply = hostile.post("acme", nested(5000).encode(), path="/tokenize")
    assert reply.status_code == 400


def test_nesting_within_the_bound_and_brackets_in_strings_pass(hostile: Hostile) -> None:
    body = completion_with(json.dumps({"text": "[[[{{{" * 500, "deep": json.loads(nested(60))}))
    reply = hostile.post("acme", body)
    assert reply.status_code == 200, reply.text


def test_too_many_values_is_400(hostile: Hostile) -> None:
    reply = hostile.post("acme", completion_with("[" + ",".join(["0"] * 300_000) + "]"))
    assert reply.status_code == 400
    assert "values" in str(error_of(reply)["message"])


@pytest.mark.parametrize(("user", "status"), [("u" * 256, 200), ("u" * 257, 400), ("é" * 129, 400)])
def test_user_field_is_at_most_256_bytes(hostile: Hostile, user: str, status: int) -> None:
    reply = hostile.post("gamma", {"model": SIM_MODEL, "prompt": "hi", "max_tokens": 1, "user": user})
    assert reply.status_code == status, reply.text
    if status == 400:
        assert error_of(reply)["param"] == "user"


@pytest.mark.parametrize(("value", "status"), [("h" * 256, 200), ("h" * 257, 400)])
def test_user_header_is_at_most_256_bytes(hostile: Hostile, value: str, status: int) -> None:
    body = {"model": SIM_MODEL, "prompt": "hi", "max_tokens": 1}
    reply = hostile.post("hdr", body, headers={USER_HEADER: value})
    assert reply.status_code == status, reply.text


def auth_failures(hostile: Hostile, reason: str) -> float:
    text = httpx.get(f"{hostile.gateway.url}/metrics", headers=bearer(hostile.policy.keys["ops"]), timeout=10).text
    prefix = f'kvgate_auth_failures_total{{reason="{reason}"}}'
    return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def models(hostile: Hostile, headers: list[tuple[bytes, bytes]]) -> httpx.Response:
    return httpx.get(f"{hostile.gateway.url}/v1/models", headers=headers, timeout=10)


def test_two_differing_authorization_headers_are_conflicting(hostile: Hostile) -> None:
    good = hostile.policy.keys["acme"].encode()
    before = auth_failures(hostile, "conflicting")
    for pair in ([b"Bearer nope", b"Bearer " + good], [b"Bearer " + good, b"Bearer nope"]):
        reply = models(hostile, [(b"authorization", value) for value in pair])
        assert reply.status_code == 401
    assert auth_failures(hostile, "conflicting") == before + 2


def test_two_differing_api_key_headers_are_conflicting(hostile: Hostile) -> None:
    good = hostile.policy.keys["acme"].encode()
    reply = models(hostile, [(b"x-api-key", good), (b"x-api-key", b"other")])
    assert reply.status_code == 401
    assert "different keys" in str(error_of(reply)["message"])


def test_repeated_identical_credentials_are_accepted(hostile: Hostile) -> None:
    good = hostile.policy.keys["acme"].encode()
    headers = [(b"authorization", b"Bearer " + good), (b"authorization", b"Bearer " + good), (b"x-api-key", good)]
    assert models(hostile, headers).status_code == 200


@pytest.mark.parametrize("value", [b"\xe9\xe9", b"\xff\xfe\x80", b"k\x01ey", "ключ".encode()])
def test_any_bytes_in_credential_headers_are_401(hostile: Hostile, value: bytes) -> None:
    request = (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + value
               + b"\r\nx-api-key: " + value[::-1] + b"\r\n\r\n")
    status, head = hostile.raw(request)
    assert status in (400, 401), head  # 400 only when the HTTP parser itself refuses the byte
    status, head = hostile.raw(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + value + b"\r\n\r\n")
    assert status in (400, 401), head


@pytest.mark.parametrize("query", ["pairs=%C2%B2", "pairs=" + "9" * 5000, "pairs=-1", "pairs=1&pairs=2", "other=1",
                                   "pairs=%ff"])
def test_shadow_query_values_are_400(hostile: Hostile, query: str) -> None:
    reply = httpx.get(f"{hostile.gateway.url}/admin/shadow?{query}", headers=bearer(hostile.policy.keys["root"]),
                      timeout=30)
    assert reply.status_code == 400, reply.text


@pytest.mark.parametrize("query", ["since=yesterday", "since=9999999999-01-01", "tenant=acme&tenant=beta", "x=1",
                                   "since=%00"])
def test_audit_query_values_are_400(hostile: Hostile, query: str) -> None:
    reply = httpx.get(f"{hostile.gateway.url}/admin/audit?{query}", headers=bearer(hostile.policy.keys["root"]),
                      timeout=30)
    assert reply.status_code == 400, reply.text


def test_valid_admin_queries_still_work(hostile: Hostile) -> None:
    headers = bearer(hostile.policy.keys["root"])
    assert httpx.get(f"{hostile.gateway.url}/admin/shadow?pairs=3", headers=headers, timeout=30).status_code == 200
    audit = httpx.get(f"{hostile.gateway.url}/admin/audit?tenant=acme&since=2026-11-29T12:00:00Z", headers=headers,
                      timeout=30)
    assert audit.status_code == 200


@pytest.mark.parametrize("query", [b'a="', b"a={}", b"a=|"])
def test_raw_bytes_in_a_forwarded_query_are_refused_by_the_gateway(hostile: Hostile, query: bytes) -> None:
    key = hostile.policy.keys["acme"].encode()
    with socket.create_connection(("127.0.0.1", hostile.gateway.port), timeout=20) as sock:
        sock.sendall(b"GET /v1/models?" + query + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + key
                     + b"\r\nConnection: close\r\n\r\n")
        raw = b"".join(iter(lambda: sock.recv(65536), b""))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert "query string" in json.loads(body)["error"]["message"]


def test_log_is_json_only(hostile: Hostile) -> None:
    for line in hostile.gateway.log_text().splitlines():
        assert isinstance(json.loads(line), dict), line


# -- compressed upstream bodies --------------------------------------------------------------------


@pytest.fixture(params=["gzip", "gzip-always"])
def zipping_gateway(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Hostile]]:
    mode: str = request.param
    with upstream_module("tests.fault_upstream", tmp_path / "zip.log", "--mode", mode) as upstream:
        policy = PolicyDir(tmp_path / "policies", {"zip": {"upstreams": [upstream.url]}})
        policy.add_tenant("acme")
        policy.add_tenant("retrying", offload={"miss_path": "retry"})
        policy.write()
        with run_gateway(policy.root, tmp_path / "gateway.log", new_secret()) as gateway:
            yield mode, Hostile(gateway, policy)


def test_compressed_upstream_bodies_are_never_relayed_unlabelled(zipping_gateway: tuple[str, Hostile]) -> None:
    mode, hostile = zipping_gateway
    body = json.dumps({"model": SIM_MODEL, "prompt": "hi", "max_tokens": 1}).encode()
    key = hostile.policy.keys["acme"]
    reply = httpx.post(f"{hostile.gateway.url}/v1/completions", content=body, timeout=30,
                       headers={**bearer(key), "content-type": "application/json", "accept-encoding": "gzip"})
    assert reply.status_code == 200
    if mode == "gzip":  # the gateway asks for identity, so a well-behaved upstream does not compress
        assert "content-encoding" not in reply.headers
    else:  # an upstream that compresses anyway: the client is told, so its HTTP library decodes the body
        assert reply.headers["content-encoding"] == "gzip"
    assert reply.json()["choices"][0]["text"] == "zipped"


@pytest.mark.parametrize("tenant", ["acme", "retrying"])
def test_an_upstream_that_answers_a_stream_with_one_compressed_body_is_relayed_whole(
    zipping_gateway: tuple[str, Hostile], tenant: str
) -> None:
    """A stream request answered with one JSON body (compressed or not): relayed whole, also for a tenant whose
    miss path holds a stream back to look for its first content (it must not keep what it looked at)."""
    mode, hostile = zipping_gateway
    body = json.dumps({"model": SIM_MODEL, "prompt": "hi", "max_tokens": 1, "stream": True}).encode()
    reply = httpx.post(f"{hostile.gateway.url}/v1/completions", content=body, timeout=30,
                       headers={**bearer(hostile.policy.keys[tenant]), "content-type": "application/json",
                                "accept-encoding": "gzip"})
    assert reply.status_code == 200
    assert reply.headers.get("content-encoding") == ("gzip" if mode == "gzip-always" else None)
    assert reply.json()["choices"][0]["text"] == "zipped"


# -- an upstream event past the bound on what a stream's scan holds ------------------------------------


@pytest.fixture(scope="module")
def giant_event_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    root = tmp_path_factory.mktemp("giant")
    with upstream_module("tests.fault_upstream", root / "giant.log", "--mode", "giant-event") as upstream:
        policy = PolicyDir(root / "policies", {"giant": {"upstreams": [upstream.url]}}, public_paths=["/metrics"])
        policy.add_tenant("acme")
        policy.add_tenant("retrying", offload={"miss_path": "retry"})
        policy.write()
        with run_gateway(policy.root, root / "gateway.log", new_secret()) as gateway:
            yield Hostile(gateway, policy)


@pytest.mark.parametrize("tenant", ["acme", "retrying"])
def test_an_event_past_the_bound_reaches_the_client_whole_and_the_events_after_it_are_read(
    giant_event_gateway: Hostile, tenant: str
) -> None:
    """A 9 MiB event (vLLM's `prompt_logprobs` of a long prompt): past 8 MiB the gateway stops holding it and
    passes it on unread, counted; the client still gets it whole, and the content and usage events after it are
    read (TTFT, prompt tokens, the usage event the client did not ask for cut out)."""
    hostile = giant_event_gateway
    unread = ("kvgate_stream_events_unread_total", {"tenant": tenant})
    before = metric_value(hostile.gateway.url, *unread)
    body = {"model": SIM_MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    reply = httpx.post(f"{hostile.gateway.url}/v1/chat/completions", json=body, timeout=60,
                       headers=bearer(hostile.policy.keys[tenant]))
    assert reply.status_code == 200
    events = sse_data(reply.text)
    assert [event == "[DONE]" or "usage" in event for event in events] == [False, False, False, True]
    assert len(events[1]["prompt_logprobs"]) > 100_000
    assert events[2]["choices"][0]["delta"]["content"] == "hi"
    entry = poll(lambda: next((json.loads(line) for line in hostile.gateway.log_text().splitlines()
                               if reply.headers["x-request-id"] in line and '"event":"request"' in line), None),
                 what="the request's log line")
    assert entry["prompt_tokens"] == 5 and entry["ttft_ms"] is not None
    poll(lambda: metric_value(hostile.gateway.url, *unread) == before + 1, what="the unread event counted")


# -- answers the gateway must hold whole, past max_answer_bytes ------------------------------------------


ANSWER_BOUND = 1024 * 1024  # the test gateway's max_answer_bytes; the upstream's answers are 9 MiB


@pytest.fixture(scope="module")
def giant_whole_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hostile]:
    root = tmp_path_factory.mktemp("giant-whole")
    with upstream_module("tests.fault_upstream", root / "giant.log", "--mode", "giant-whole") as upstream:
        policy = PolicyDir(root / "policies", {"giant": {"upstreams": [upstream.url]}}, public_paths=["/metrics"],
                           max_answer_bytes=ANSWER_BOUND)
        policy.add_tenant("acme")
        policy.add_tenant("retrying", offload={"miss_path": "retry"})
        policy.add_tenant("timing", measure_ttft=True)
        policy.write()
        with run_gateway(policy.root, root / "gateway.log", new_secret()) as gateway:
            yield Hostile(gateway, policy)


@pytest.mark.parametrize(("tenant", "prompt", "path"), [
    ("acme", "hi", "a 200 body"),
    ("acme", "fail", "a 500 body, relayed whole"),
    ("retrying", "fail", "a 500 body, read whole by the miss path"),
])
def test_an_answer_past_max_answer_bytes_is_refused_with_a_clear_502_and_never_held_whole(
    giant_whole_gateway: Hostile, tenant: str, prompt: str, path: str
) -> None:
    """A 9 MiB answer to a request that is not streamed: the gateway stops at its 1 MiB bound, answers 502
    `upstream_answer_too_large` and says so on the request's log line; a 500 as large is refused the same way."""
    hostile = giant_whole_gateway
    before = metric_value(hostile.gateway.url, "kvgate_requests_total",
                          {"tenant": tenant, "pool": "giant", "route": "/v1/completions", "status": "502"})
    reply = hostile.post(tenant, {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 1})
    assert reply.status_code == 502, path
    assert error_of(reply)["code"] == "upstream_answer_too_large"
    assert "max_answer_bytes" in str(error_of(reply)["message"])
    entry = poll(lambda: next((json.loads(line) for line in hostile.gateway.log_text().splitlines()
                               if reply.headers["x-request-id"] in line and '"event":"request"' in line), None),
                 what="the request's log line")
    assert entry["error"] == "UpstreamAnswerTooLarge"
    poll(lambda: metric_value(hostile.gateway.url, "kvgate_requests_total",
                              {"tenant": tenant, "pool": "giant", "route": "/v1/completions", "status": "502"})
         == before + 1, what="the refusal counted")


def test_an_answer_past_max_answer_bytes_is_not_retried_by_the_miss_path(giant_whole_gateway: Hostile) -> None:
    """The engine answered; only its size was refused. A recompute would bring an answer just as large, so the miss
    path leaves it: one upstream request, no retry on the log line."""
    hostile = giant_whole_gateway
    reply = hostile.post("retrying", {"model": SIM_MODEL, "prompt": "hi", "max_tokens": 1})
    assert reply.status_code == 502 and error_of(reply)["code"] == "upstream_answer_too_large"
    entry = poll(lambda: next((json.loads(line) for line in hostile.gateway.log_text().splitlines()
                               if reply.headers["x-request-id"] in line and '"event":"request"' in line), None),
                 what="the request's log line")
    assert entry["error"] == "UpstreamAnswerTooLarge"
    assert "miss_path" not in entry


def test_the_gateways_small_calls_to_an_upstream_read_at_most_their_bound(giant_whole_gateway: Hostile) -> None:
    """`/version` (the miss path), `/v1/models` and `/metrics` (canary, plan) are read through one helper: a 9 MiB
    answer fails the call, with the error every caller already treats as a failed call, past a bound below it;
    under a bound above it the whole body arrives."""
    upstream = giant_whole_gateway.policy.gateway["pools"]["giant"]["upstreams"][0]

    async def read(max_bytes: int) -> int:
        calls = SmallCalls.pooled(connections=2, connect_timeout_s=5, read_timeout_s=30)
        try:
            session = await calls.session()
            async with session.get(f"{upstream}/version") as response:
                return len(await read_small(response, max_bytes))
        finally:
            await calls.close()

    with pytest.raises(client_error()):
        asyncio.run(read(ANSWER_BOUND))
    assert asyncio.run(read(16 * ANSWER_BOUND)) > 8 * ANSWER_BOUND


def test_a_stream_the_gateway_assembles_is_bounded_too_and_a_streamed_answer_is_not(
    giant_whole_gateway: Hostile,
) -> None:
    """`measure_ttft` streams upstream and answers the client in one body, so it holds the stream whole: past the
    bound it is refused like a body. The same 9 MiB asked for as a stream is passed on as it comes, whole."""
    hostile = giant_whole_gateway
    body: dict[str, object] = {"model": SIM_MODEL, "messages": [{"role": "user", "content": "hi"}]}
    assembled = hostile.post("timing", body, path="/v1/chat/completions")
    assert assembled.status_code == 502
    assert error_of(assembled)["code"] == "upstream_answer_too_large"
    streamed = hostile.post("timing", {**body, "stream": True}, path="/v1/chat/completions")
    assert streamed.status_code == 200
    assert len(streamed.content) > 8 * ANSWER_BOUND
    assert sse_data(streamed.text)[-1] == "[DONE]"


# -- a store that goes away under the gateway ------------------------------------------------------


@pytest.mark.redis
def test_reports_whose_store_is_down_answer_503_not_500(sim: ServerProcess, tmp_path: Path) -> None:
    """Redis SIGKILLed under the gateway: every report that reads it says so with a retryable 503."""
    redis_server = RedisProcess(tmp_path / "redis").start()
    policy = standard_policy(tmp_path / "policies", sim.url)
    policy.write()
    env = {UPSTREAM_KEY_ENV: UPSTREAM_KEY, "KVGATE_REDIS_URL": redis_server.url}
    try:
        with run_gateway(policy.root, tmp_path / "gateway.log", new_secret(), env) as gateway:
            redis_server.kill()
            root = bearer(policy.keys["root"])
            replies = {path: httpx.get(f"{gateway.url}{path}", headers=root, timeout=30)
                       for path in ("/admin/shadow", "/admin/plan", "/admin/audit")}
            metrics = httpx.get(f"{gateway.url}/metrics", headers=bearer(policy.keys["ops"]), timeout=10).text
    finally:
        redis_server.stop()
    assert {path: reply.status_code for path, reply in replies.items()} == dict.fromkeys(replies, 503)
    assert all(error_of(reply)["type"] == "service_unavailable" for reply in replies.values())
    assert "kvgate_internal_errors_total{" not in metrics
