"""The simulator's ASGI app in-process (the test plays the ASGI server): vLLM's API-key check, exact-path routing,
the operational routes, the test seams and their records, generation replies and directives, client
disconnects, and the lifespan that owns the KV-event publisher."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import struct
from typing import Any

import pytest

from gateway.sim.app import SimApp
from gateway.sim.asgi import Message
from gateway.sim.auth import ApiKeyGuard
from gateway.sim.config import SimConfig
from gateway.sim.generate import LOAD_FAILED_MESSAGE
from gateway.sim.routes import EMBEDDING_DIMENSIONS, ROUTES, embed, embedding_inputs
from gateway.sim.tokenizer import encode
from tests.unit.sim.asgi_exchange import Exchange, call, until
from tests.unit.sim.engine_kit import settings

KEY = "sk-sim-test"


def app(**overrides: Any) -> SimApp:
    return SimApp(settings(**overrides))


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def records(sim: SimApp) -> list[dict[str, Any]]:
    return sim.state.recorder.snapshot()


# --- vLLM's API-key middleware -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "guarded"),
    [
        ("GET", "/v1/models", True),
        ("POST", "/v1/completions", True),
        ("GET", "/v1xyz", True),  # a plain prefix test, as vLLM's
        ("GET", "/v2/anything", True),
        ("POST", "/inference/v1/generate", True),
        ("POST", "/cohere/rerank", True),
        ("OPTIONS", "/v1/models", False),
        ("GET", "/health", False),
        ("GET", "/metrics", False),
        ("POST", "/tokenize", False),
        ("POST", "/invocations", False),
        ("GET", "/sim/requests", False),
        ("GET", "/V1/models", False),  # case-sensitive paths
    ],
)
def test_guarded_paths(method: str, path: str, guarded: bool) -> None:
    assert ApiKeyGuard([KEY]).guards(method, path) is guarded
    assert ApiKeyGuard([]).guards(method, path) is False  # no key configured: nothing is guarded


@pytest.mark.parametrize(
    ("authorization", "accepted"),
    [
        (f"Bearer {KEY}", True),
        (f"bearer {KEY}", True),
        (f"BEARER {KEY}", True),
        ("Bearer other", True),  # the second configured key
        (f"Bearer  {KEY}", False),  # the token is everything after the first space
        (f"Basic {KEY}", False),
        (KEY, False),
        ("Bearer", False),
        ("Bearer ", False),
        (None, False),
        (f"Bearer {KEY} ", False),
    ],
)
def test_bearer_tokens(authorization: str | None, accepted: bool) -> None:
    assert ApiKeyGuard([KEY, "other", ""]).accepts(authorization) is accepted


def test_an_empty_key_enables_nothing() -> None:
    guard = ApiKeyGuard(["", ""])
    assert guard.enabled is False and guard.accepts("Bearer ") is False


def test_a_refusal_is_vllms_401_body_before_routing_and_is_recorded() -> None:
    sim = app(api_keys=(KEY,))

    async def scenario() -> tuple[Exchange, Exchange, Exchange]:
        missing = await call(sim, "GET", "/v1/nothing-here")
        wrong = await call(sim, "POST", "/v1/completions", {"prompt": "x"}, {"authorization": "Bearer nope"})
        right = await call(sim, "GET", "/v1/models", headers={"authorization": f"Bearer {KEY}"})
        return missing, wrong, right

    missing, wrong, right = run(scenario())
    assert (missing.status, missing.content) == (401, b'{"error":"Unauthorized"}')  # not a 404: auth comes first
    assert (wrong.status, right.status) == (401, 200)
    assert [r["status"] for r in records(sim)] == [401, 401, 200]
    assert records(sim)[1]["body_seen"] is False  # refused before the body was read


# --- routing --------------------------------------------------------------------------------------------------


def test_unknown_paths_are_404_and_wrong_methods_405_in_vllms_error_shape() -> None:
    sim = app()

    async def scenario() -> tuple[Exchange, Exchange, Exchange]:
        return (await call(sim, "GET", "/v1/nothing"), await call(sim, "GET", "/v1/completions"),
                await call(sim, "GET", "/health/"))

    unknown, wrong, trailing = run(scenario())
    assert (unknown.status, unknown.json()["error"]["type"]) == (404, "Not Found")
    assert (wrong.status, wrong.json()["error"]) == (405, {"message": "Method Not Allowed",
                                                           "type": "Method Not Allowed", "param": None,
                                                           "code": 405})
    assert trailing.status == 404  # exact paths only


def test_every_route_answers_its_methods() -> None:
    sim = app()

    async def scenario() -> dict[tuple[str, str], int]:
        statuses = {}
        for path, methods in ROUTES.items():
            for method in methods:
                exchange = await call(sim, method, path, {"prompt": "x", "max_tokens": 1, "tokens": [100],
                                                          "input": "x", "messages": [{"role": "user",
                                                                                      "content": "x"}]})
                statuses[(method, path)] = exchange.status
        return statuses

    statuses = run(scenario())
    assert {key for key, status in statuses.items() if status != 200} == {("GET", "/server_info"),
                                                                          ("GET", "/sim/kv-truth")}


# --- operational routes ------------------------------------------------------------------------------------


def test_probes_version_load_and_models() -> None:
    sim = app(model="m", max_model_len=4096, vllm_version="0.33.1")

    async def scenario() -> list[Exchange]:
        return [await call(sim, "GET", "/health"), await call(sim, "POST", "/ping"),
                await call(sim, "GET", "/version"), await call(sim, "GET", "/load"),
                await call(sim, "GET", "/v1/models")]

    health, ping, version, load, models = run(scenario())
    assert (health.status, health.content, "content-type" in health.headers) == (200, b"", False)
    assert ping.status == 200
    assert version.json() == {"version": "0.33.1"}
    assert load.json() == {"server_load": 0}
    card = models.json()["data"][0]
    assert (card["id"], card["root"], card["max_model_len"], card["owned_by"]) == ("m", "m", 4096, "vllm")
    assert card["created"] == sim.state.started_at


def test_sleep_levels_and_wake_up() -> None:
    sim = app()

    async def scenario() -> list[Any]:
        seen = [(await call(sim, "GET", "/is_sleeping")).json()]
        await call(sim, "POST", "/sleep", query="level=2")
        seen.append((sim.state.sleep_level, (await call(sim, "GET", "/is_sleeping")).json()))
        await call(sim, "POST", "/sleep", query="level=7")  # anything but 2 is level 1
        seen.append(sim.state.sleep_level)
        await call(sim, "POST", "/wake_up")
        seen.append((sim.state.sleep_level, (await call(sim, "GET", "/is_sleeping")).json()))
        return seen

    assert run(scenario()) == [{"is_sleeping": False}, (2, {"is_sleeping": True}), 1, (0, {"is_sleeping": False})]


@pytest.mark.parametrize(("query", "external"), [("", False), ("reset_external=true", True),
                                                 ("reset_external=1", True), ("reset_external=no", False),
                                                 ("reset_external=false&reset_external=YES", True)])
def test_reset_prefix_cache_and_its_reset_external_flag(query: str, external: bool) -> None:
    sim = app(offload=True)

    async def scenario() -> tuple[Any, int]:
        await call(sim, "POST", "/v1/completions", {"prompt": "x" * 128, "max_tokens": 1})
        reply = await call(sim, "POST", "/reset_prefix_cache", query=query)
        assert sim.state.engine.offload is not None
        return reply.json(), len(sim.state.engine.offload.tier)

    assert run(scenario()) == ({"success": True}, 0 if external else 2)
    assert sim.state.reset_calls == 1
    assert sim.state.engine.cache.cached_blocks == 0


def test_server_info_exists_only_in_dev_mode() -> None:
    async def scenario(sim: SimApp) -> Exchange:
        return await call(sim, "GET", "/server_info")

    assert run(scenario(app())).status == 404
    info = run(scenario(app(server_dev_mode=True, offload=True, load_failure_policy="recompute"))).json()
    transfer = info["vllm_config"]["kv_transfer_config"]
    assert (transfer["kv_connector"], transfer["kv_load_failure_policy"]) == ("OffloadingConnector", "recompute")
    assert transfer["kv_connector_extra_config"] == {"block_size": 64, "cpu_bytes_to_use": 12_000_000_000}
    assert run(scenario(app(server_dev_mode=True))).json()["vllm_config"]["kv_transfer_config"] is None


def test_kv_event_sources_and_truth_without_events() -> None:
    sim = app()

    async def scenario() -> tuple[Exchange, Exchange]:
        return await call(sim, "GET", "/kv_event_sources"), await call(sim, "GET", "/sim/kv-truth")

    sources, truth = run(scenario())
    assert sources.json() == {"0": {"enable_kv_cache_events": False, "publisher": "null"}}
    assert truth.status == 404


def test_metrics_route_negotiates_its_format() -> None:
    sim = app()
    exchange = run(call(sim, "GET", "/metrics", headers={"accept": "application/openmetrics-text"}))
    assert exchange.headers["content-type"].startswith("application/openmetrics-text")
    assert exchange.content.endswith(b"# EOF\n")


# --- tokenizer and embeddings -------------------------------------------------------------------------------


def test_tokenize_and_detokenize() -> None:
    sim = app(max_model_len=999)

    async def scenario() -> list[Exchange]:
        return [await call(sim, "POST", "/tokenize", {"prompt": "hé"}),
                await call(sim, "POST", "/tokenize", {"messages": [{"role": "user", "content": "x"}],
                                                      "add_generation_prompt": False}),
                await call(sim, "POST", "/tokenize", {"model": "other", "prompt": "x"}),
                await call(sim, "POST", "/tokenize", {"prompt": 5}),
                await call(sim, "POST", "/detokenize", {"tokens": [107, 198, 172]}),
                await call(sim, "POST", "/detokenize", {"tokens": [1, 40000]}),
                await call(sim, "POST", "/detokenize", {"tokens": "abc"})]

    text, chat, model, bad, back, oov, not_list = run(scenario())
    assert text.json() == {"count": 3, "max_model_len": 999, "tokens": encode("hé"), "token_strs": None}
    assert chat.json()["count"] == 2 + len("user\nx") + 1  # no generation prompt: only the message and "\n"
    assert model.status == 404
    assert bad.status == 400 and bad.json()["error"]["param"] == "body.prompt"
    assert back.json() == {"prompt": "hé"}
    assert oov.json()["error"]["message"] == "Token id 40000 is out of vocabulary"
    assert not_list.json()["error"]["param"] == "body.tokens"


@pytest.mark.parametrize(
    ("value", "count"),
    [("a", 1), (["a", "b"], 2), ([5, 6], 1), ([[5], [6, 7]], 2)],
)
def test_embedding_inputs(value: object, count: int) -> None:
    assert len(embedding_inputs(value)) == count


@pytest.mark.parametrize("value", ["", [], [""], [[]], [1.5], None, [["a"]], {"a": 1}])
def test_embedding_inputs_that_are_refused(value: object) -> None:
    with pytest.raises(Exception, match="Input should be text or token ids"):
        embedding_inputs(value)


def test_embeddings_are_unit_vectors_that_depend_on_the_tokens_only() -> None:
    vector = embed(encode("a b"))
    assert len(vector) == EMBEDDING_DIMENSIONS
    assert abs(sum(x * x for x in vector) - 1.0) < 1e-6
    assert vector == embed(encode("a b")) != embed(encode("a c"))


def test_the_embeddings_route_in_both_encodings() -> None:
    sim = app()

    async def scenario() -> tuple[Any, Any]:
        floats = await call(sim, "POST", "/v1/embeddings", {"input": ["a b", "c"]}, {"x-request-id": "e1"})
        packed = await call(sim, "POST", "/v1/embeddings", {"input": "a b", "encoding_format": "base64"})
        return floats.json(), packed.json()

    floats, packed = run(scenario())
    assert floats["id"] == "embd-e1"
    assert floats["usage"] == {"prompt_tokens": 4, "total_tokens": 4, "completion_tokens": 0,
                               "prompt_tokens_details": None}
    raw = base64.b64decode(packed["data"][0]["embedding"])
    assert list(struct.unpack(f"<{EMBEDDING_DIMENSIONS}f", raw)) == floats["data"][0]["embedding"]


# --- the records behind GET /sim/requests -------------------------------------------------------------------


def test_a_record_keeps_what_a_proxy_test_needs_and_never_a_credential() -> None:
    sim = app(api_keys=(KEY,))
    body = {"model": "sim-model", "prompt": "x" * 40, "max_tokens": 3, "cache_salt": "s",
            "kv_transfer_params": {"max_load_tokens": 0}, "stream": False, "store": False, "zz": 1}
    headers = {"authorization": f"Bearer {KEY}", "x-api-key": "k2", "cookie": "c=1", "x-request-id": "rid-1",
               "User-Agent": "ua"}
    exchange = run(call(sim, "POST", "/v1/completions", body, headers, query="a=1&a=2"))
    assert exchange.status == 200
    (record,) = records(sim)
    assert (record["method"], record["path"], record["query"], record["request_id"]) == (
        "POST", "/v1/completions", {"a": ["1", "2"]}, "rid-1")
    assert "authorization" not in record["headers"] and "cookie" not in record["headers"]
    assert record["headers"]["user-agent"] == "ua"
    assert record["credential_sha256"] == {
        "authorization": hashlib.sha256(f"Bearer {KEY}".encode()).hexdigest(),
        "x-api-key": hashlib.sha256(b"k2").hexdigest(), "cookie": hashlib.sha256(b"c=1").hexdigest()}
    assert KEY not in json.dumps(record)
    assert (record["status"], record["outcome"], record["body_seen"]) == (200, "completed", True)
    assert (record["model"], record["cache_salt_present"], record["cache_salt"]) == ("sim-model", True, "s")
    assert record["kv_transfer_params"] == {"max_load_tokens": 0}
    assert record["body_keys"] == sorted(body) and record["store"] is False
    assert (record["prompt_tokens"], record["completion_tokens"], record["cached_tokens"]) == (40, 3, 0)
    assert record["planned_prefill_ms"] == 0.0  # the quiet settings: no modelled prefill time
    assert "x" * 40 not in json.dumps(record)  # never the prompt


def test_records_are_bounded_and_clearable_and_seams_are_not_recorded() -> None:
    sim = app(record_limit=3)

    async def scenario() -> tuple[list[int], Any]:
        for _ in range(5):
            await call(sim, "GET", "/health")
        await call(sim, "GET", "/sim/state")
        kept = [r["seq"] for r in records(sim)]
        cleared = (await call(sim, "DELETE", "/sim/requests")).json()
        return kept, cleared

    kept, cleared = run(scenario())
    assert kept == [2, 3, 4]  # the oldest went; the seam request took a seq but no place
    assert cleared == {"cleared": True} and records(sim) == []


def test_the_state_seam() -> None:
    sim = app(offload=True, gpu_blocks=100)

    async def scenario() -> Any:
        await call(sim, "POST", "/v1/completions", {"prompt": "x" * 70, "max_tokens": 1})
        return (await call(sim, "GET", "/sim/state")).json()

    state = run(scenario())
    assert state["gpu"] == {"num_blocks": 100, "cached_blocks": 4, "blocks_in_use": 0, "usage": 0.0}
    assert state["cpu"] == {"num_chunks": 1271, "stored_chunks": 1}
    assert (state["lmcache"], state["kv_events"], state["waiting"], state["running"]) == (None, None, 0, 0)
    assert (state["load_failures"], state["load_failure_policy"]) == (0, "fail")


# --- generation ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("content_type", "status"), [("application/json", 200),
                                                      ("Application/JSON; charset=utf-8", 200),
                                                      ("text/plain", 400), ("", 400),
                                                      ("application/json-patch+json", 400)])
def test_generation_needs_a_json_media_type(content_type: str, status: int) -> None:
    exchange = run(call(app(), "POST", "/v1/completions", raw=b'{"prompt": "x", "max_tokens": 1}',
                        headers={"content-type": content_type} if content_type else {}))
    assert exchange.status == status


@pytest.mark.parametrize("status", [400, 429, 500, 503])
def test_the_status_directive_answers_that_status_before_any_work(status: int) -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/completions", {"prompt": f"[[sim:status={status}]]", "max_tokens": 1}))
    assert (exchange.status, exchange.json()["error"]["code"]) == (status, status)
    assert sim.state.engine.cache.cached_blocks == 0 and records(sim)[0]["outcome"] == "completed"


def test_error_after_in_a_non_stream_reply_is_a_500() -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/completions", {"prompt": "[[sim:error-after=1]]", "max_tokens": 4}))
    assert exchange.status == 500
    assert exchange.json()["error"]["message"] == "Simulated generation failure."


def test_error_after_in_a_stream_is_an_error_event_after_n_tokens() -> None:
    exchange = run(call(app(), "POST", "/v1/completions", {"prompt": "[[sim:error-after=2]]", "max_tokens": 5,
                                                            "stream": True}))
    events = [b for b in exchange.content.decode().split("\n\n") if b]
    assert len(events) == 4 and events[-1] == "data: [DONE]"
    assert json.loads(events[2][len("data: "):])["error"]["message"] == "Simulated mid-stream failure."


def test_drop_after_truncates_a_body_under_its_announced_length() -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/completions", {"prompt": "[[sim:drop-after=1]]", "max_tokens": 4}))
    announced = int(exchange.headers["content-length"])
    assert len(exchange.content) == announced // 2 and not exchange.complete
    assert records(sim)[0]["outcome"] == "dropped"


def test_drop_after_ends_a_stream_without_done() -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "[[sim:drop-after=2]]"}], "max_tokens": 5, "stream": True}))
    text = exchange.content.decode()
    assert "[DONE]" not in text and text.count("data: ") == 3  # the role chunk and two tokens
    assert (records(sim)[0]["outcome"], records(sim)[0]["completion_tokens"]) == ("dropped", 2)


def test_a_hung_request_ends_when_the_client_goes_away() -> None:
    sim = app()

    async def scenario() -> Exchange:
        body = json.dumps({"prompt": "[[sim:hang]]", "max_tokens": 1}).encode()
        exchange = Exchange("POST", "/v1/completions", body, {"content-type": "application/json"})
        async with asyncio.TaskGroup() as group:
            group.create_task(sim(exchange.scope, exchange.receive, exchange.send))
            await until(lambda: sim.state.in_flight == 1, "the request to be in flight")
            exchange.client_gone.set()
        return exchange

    exchange = run(scenario())
    assert exchange.sent == []  # not even headers
    assert (records(sim)[0]["outcome"], sim.state.in_flight) == ("aborted", 0)


def test_a_client_that_leaves_mid_stream_stops_its_generation() -> None:
    sim = app(decode_ms_per_token=3_600_000.0)  # an hour between tokens: only the disconnect ends it

    async def scenario() -> Exchange:
        body = json.dumps({"prompt": "x" * 20, "max_tokens": 3, "stream": True}).encode()
        exchange = Exchange("POST", "/v1/completions", body, {"content-type": "application/json"})
        async with asyncio.TaskGroup() as group:
            group.create_task(sim(exchange.scope, exchange.receive, exchange.send))
            await until(lambda: exchange.content.count(b"data: ") == 1, "the first token")
            exchange.client_gone.set()
        return exchange

    run(scenario())
    (record,) = records(sim)
    assert (record["outcome"], record["completion_tokens"], record["status"]) == ("aborted", 1, 200)
    assert sim.state.engine.running == 0 and sim.state.engine.cache.blocks_in_use == 0
    value = sim.state.metrics.registry.get_sample_value
    assert value("vllm:request_success_total", {"model_name": "sim-model", "engine": "0",
                                                "finished_reason": "abort"}) == 1


def test_a_stream_runs_to_its_usage_chunk_and_done() -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/completions", {"prompt": "x" * 20, "max_tokens": 4, "stream": True,
                                                          "stream_options": {"include_usage": True}}))
    assert exchange.headers["content-type"] == "text/event-stream; charset=utf-8" and exchange.complete
    events = [b[len("data: "):] for b in exchange.content.decode().split("\n\n") if b]
    assert len(events) == 6 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:4]] == [None, None, None, "length"]
    assert chunks[4]["usage"]["completion_tokens"] == 4 and chunks[4]["choices"] == []
    (record,) = records(sim)
    assert (record["outcome"], record["completion_tokens"], record["stream"]) == ("completed", 4, True)
    value = sim.state.metrics.registry.get_sample_value
    assert value("vllm:inter_token_latency_seconds_count", {"model_name": "sim-model", "engine": "0"}) == 3


def test_a_delay_directive_holds_the_request_out_of_the_engine_after_the_stream_headers() -> None:
    sim = app()

    async def scenario() -> tuple[Exchange, tuple[int, int, int]]:
        body = json.dumps({"prompt": "[[sim:delay-ms=3600000]]", "max_tokens": 1, "stream": True}).encode()
        exchange = Exchange("POST", "/v1/completions", body, {"content-type": "application/json"})
        async with asyncio.TaskGroup() as group:
            group.create_task(sim(exchange.scope, exchange.receive, exchange.send))
            await until(lambda: bool(exchange.sent), "the stream's headers")
            seen = (sim.state.engine.waiting, sim.state.engine.running, sim.state.in_flight)
            exchange.client_gone.set()
        return exchange, seen

    exchange, (waiting, running, in_flight) = run(scenario())
    assert exchange.status == 200 and not exchange.complete
    assert (waiting, running, in_flight) == (0, 0, 1)  # in flight, but neither queued nor running
    assert records(sim)[0]["outcome"] == "aborted" and records(sim)[0]["gpu_hit_tokens"] is None


def test_a_request_cancelled_by_the_server_is_recorded_as_aborted() -> None:
    sim = app()

    async def scenario() -> None:
        body = json.dumps({"prompt": "[[sim:hang]]", "max_tokens": 1}).encode()
        exchange = Exchange("POST", "/v1/completions", body, {"content-type": "application/json"})
        async with asyncio.TaskGroup() as group:
            task = group.create_task(sim(exchange.scope, exchange.receive, exchange.send))
            await until(lambda: sim.state.in_flight == 1, "the request to be in flight")
            task.cancel()  # what a server shutting down does to its handlers

    run(scenario())
    assert (records(sim)[0]["outcome"], records(sim)[0]["status"], sim.state.in_flight) == ("aborted", 200, 0)


def test_reset_external_empties_the_lmcache_tier() -> None:
    sim = app(lmcache=True, lmcache_chunk_size=64)

    async def scenario() -> list[int]:
        await call(sim, "POST", "/v1/completions", {"prompt": "x" * 128, "max_tokens": 1})
        assert sim.state.engine.lmcache is not None
        sizes = [len(sim.state.engine.lmcache)]
        await call(sim, "POST", "/reset_prefix_cache")
        sizes.append(len(sim.state.engine.lmcache))
        await call(sim, "POST", "/reset_prefix_cache", query="reset_external=true")
        sizes.append(len(sim.state.engine.lmcache))
        state = (await call(sim, "GET", "/sim/state")).json()["lmcache"]
        sizes.append(state["stored_chunks"])
        return sizes

    assert run(scenario()) == [2, 2, 0, 0]


def test_a_failed_load_is_a_500_or_an_error_event() -> None:
    sim = app(offload=True, gpu_blocks=8)
    prompt = "[[sim:fail-load]]" + "x" * 111

    async def scenario() -> tuple[Exchange, Exchange]:
        await call(sim, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        await call(sim, "POST", "/v1/completions", {"prompt": "y" * 128, "max_tokens": 1})
        plain = await call(sim, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        await call(sim, "POST", "/v1/completions", {"prompt": "y" * 128, "max_tokens": 1})
        streamed = await call(sim, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 1, "stream": True})
        return plain, streamed

    plain, streamed = run(scenario())
    assert (plain.status, plain.json()["error"]["message"]) == (500, LOAD_FAILED_MESSAGE)
    assert streamed.status == 200 and LOAD_FAILED_MESSAGE.encode() in streamed.content
    assert streamed.content.endswith(b"data: [DONE]\n\n")
    assert [r["outcome"] for r in records(sim)][2::2] == ["load_failed", "load_failed"]
    assert sim.state.engine.load_failures == 2


def test_invocations_serve_chat_and_completion_bodies() -> None:
    sim = app()

    async def scenario() -> tuple[Any, Any]:
        chat = await call(sim, "POST", "/invocations", {"messages": [{"role": "user", "content": "x"}],
                                                        "max_tokens": 1})
        completion = await call(sim, "POST", "/invocations", {"prompt": "x", "max_tokens": 1})
        return chat.json(), completion.json()

    chat, completion = run(scenario())
    assert (chat["object"], completion["object"]) == ("chat.completion", "text_completion")


@pytest.mark.parametrize(("flag", "sent", "echoed"), [(False, "r1", None), (True, "r1", "r1"), (True, None, "any")])
def test_request_id_headers(flag: bool, sent: str | None, echoed: str | None) -> None:
    headers = {"x-request-id": sent} if sent else {}
    exchange = run(call(app(enable_request_id_headers=flag), "POST", "/v1/completions",
                        {"prompt": "x", "max_tokens": 1}, headers))
    got = exchange.headers.get("x-request-id")
    if echoed == "any":
        assert got is not None and len(got) == 32
    else:
        assert got == echoed
    if sent:
        assert exchange.json()["id"] == f"cmpl-{sent}"


def test_the_responses_route() -> None:
    exchange = run(call(app(), "POST", "/v1/responses", {"input": "hi", "max_output_tokens": 3},
                        {"x-request-id": "q"}))
    body = exchange.json()
    assert (body["id"], body["object"], body["status"]) == ("resp_q", "response", "completed")
    assert len(body["output"][0]["content"][0]["text"]) == 3


def test_validation_errors_are_recorded_with_their_status() -> None:
    sim = app()
    exchange = run(call(sim, "POST", "/v1/completions", raw=b"{bad", headers={"content-type": "application/json"}))
    assert exchange.status == 400
    assert (records(sim)[0]["status"], records(sim)[0]["body_seen"]) == (400, False)


# --- lifespan -------------------------------------------------------------------------------------------------


async def lifespan(sim: SimApp) -> list[Message]:
    messages: list[Message] = []
    incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> Message:
        return incoming.pop(0)

    async def send(message: Message) -> None:
        messages.append(message)

    await sim({"type": "lifespan"}, receive, send)
    return messages



def test_lifespan_without_events() -> None:
    assert [m["type"] for m in run(lifespan(app()))] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_lifespan_fails_startup_when_the_publisher_cannot_open() -> None:
    messages = run(lifespan(app(kv_events_endpoint="bogus://nowhere")))
    assert [m["type"] for m in messages] == ["lifespan.startup.failed"]
    assert messages[0]["message"]


def test_lifespan_runs_and_stops_the_publisher(tmp_path_factory: pytest.TempPathFactory) -> None:
    folder = tmp_path_factory.mktemp("lf", numbered=True)
    sim = app(kv_events_endpoint=f"ipc://{folder / 'p'}")
    assert [m["type"] for m in run(lifespan(sim))] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert sim.publisher is not None and sim.publisher.next_seq == 0


def test_the_config_refuses_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="two KV connectors"):
        SimConfig(offload=True, lmcache=True)
