"""The protocol's plan (gateway.devtools.loadtest.runner: repetitions, steps, arm order, step count), the
streamed-request client (.client) and the observer's reads (.observe), the last two against a real aiohttp
server on loopback that plays a gateway and an upstream."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.devtools.loadtest.client import Ask, Outcome, request_body, stream_completion
from gateway.devtools.loadtest.model import Scenario
from gateway.devtools.loadtest.observe import Observer
from gateway.devtools.loadtest.progress import Progress
from gateway.devtools.loadtest.runner import ProtocolRunner, source_ends
from gateway.devtools.loadtest.targets import Access, Targets, TenantAccess, Upstream
from tests.unit.loopback import serving


def _scenario(**fields: Any) -> Scenario:
    return Scenario.model_validate({"name": "t", "tenants": [{"name": "acme"}, {"name": "beta"}],
                                    "prefix_tokens": 50, "pressure": {"tokens": 70}, **fields})


def _targets(url: str | None = None, gateway: str = "http://127.0.0.1:9") -> Targets:
    access = Access("admin", {t: TenantAccess(f"key-{t}", {"offload": f"{t}-u1", "control": f"{t}-u0"})
                              for t in ("acme", "beta")})
    return Targets(gateway, access, {arm: Upstream(arm, url) for arm in ("offload", "control")}, "test")


def _runner(scenario: Scenario, pressure: int = 5) -> ProtocolRunner:
    return ProtocolRunner(scenario, _targets(), httpx.AsyncClient(), {}, pressure, Progress(1))


def test_repetitions_start_with_the_warm_up_ones() -> None:
    assert list(_runner(_scenario(repetitions=3, warmup_repetitions=2)).reps()) == [-2, -1, 0, 1, 2]
    assert list(_runner(_scenario(repetitions=1, warmup_repetitions=0)).reps()) == [0]


def test_pressure_prompts_are_spread_over_the_tenants_and_fresh_per_repetition() -> None:
    runner = _runner(_scenario())
    steps = runner.phase_steps("pressure", 0)
    assert [(s.tenant, s.role, s.rep, len(s.prompt)) for s in steps] == \
        [("acme", "pressure", 0, 70), ("beta", "pressure", 0, 70), ("acme", "pressure", 0, 70),
         ("beta", "pressure", 0, 70), ("acme", "pressure", 0, 70)]
    assert len({tuple(s.prompt) for s in steps}) == 5
    assert {tuple(s.prompt) for s in steps}.isdisjoint({tuple(s.prompt) for s in runner.phase_steps("pressure", 1)})


def test_cold_repeat_and_return_send_the_same_prefix_within_a_repetition() -> None:
    runner = _runner(_scenario())
    by_phase = {phase: runner.phase_steps(phase, 1) for phase in ("cold", "repeat", "return")}
    assert [(s.tenant, s.role, len(s.prompt)) for s in by_phase["cold"]] == [("acme", "prefix", 50),
                                                                            ("beta", "prefix", 50)]
    assert by_phase["cold"] == by_phase["repeat"] == by_phase["return"]
    assert by_phase["cold"] != runner.phase_steps("cold", 2)  # a new repetition, a new prefix
    assert by_phase["cold"][0].prompt != by_phase["cold"][1].prompt  # tenants never share a prefix


@pytest.mark.parametrize(("samples", "reps"), [(0, [0, 1, 2]), (1, [2]), (2, [1, 2]), (9, [0, 1, 2])])
def test_restart_steps_resend_the_last_prefixes(samples: int, reps: list[int]) -> None:
    runner = _runner(_scenario(repetitions=3, restart_samples=samples))
    steps = runner.restart_steps()
    assert [(s.rep, s.tenant) for s in steps] == [(rep, t) for rep in reps for t in ("acme", "beta")]
    assert steps[-1].prompt == runner.phase_steps("cold", 2)[-1].prompt


@pytest.mark.parametrize(("fields", "pressure", "total"), [
    # per repetition (2 + 2 + 5 + 2) x 2 arms x 4 repetitions, + 2 arms x (2 probes + 6 restart prefixes)
    ({"repetitions": 3, "warmup_repetitions": 1}, 5, 11 * 2 * 4 + 2 * (2 + 6)),
    ({"repetitions": 3, "warmup_repetitions": 1, "overhead_pairs": 4}, 5, 11 * 2 * 4 + 2 * 8 + 8),
    ({"repetitions": 1, "warmup_repetitions": 0, "phases": ["cold", "repeat"]}, 5, 4 * 2),
    ({"repetitions": 2, "warmup_repetitions": 0, "phases": ["cold", "pressure", "return"]}, 1, 5 * 2 * 2),
    ({"repetitions": 2, "warmup_repetitions": 0, "phases": ["restart"], "restart_samples": 1}, 1, 2 * (2 + 2)),
])
def test_the_step_count_the_progress_bar_counts_to(fields: dict[str, Any], pressure: int, total: int) -> None:
    assert _runner(_scenario(**fields), pressure).total_steps() == total


def test_arms_alternate_which_goes_first() -> None:
    runner = _runner(_scenario())
    assert [runner.arm_order(rep) for rep in (-1, 0, 1, 2)] == [["control", "offload"], ["offload", "control"],
                                                               ["control", "offload"], ["offload", "control"]]


@pytest.mark.parametrize(("audit", "pool", "ends"), [
    (None, "offload", 0),
    ({}, "offload", 0),
    ({"gaps": [{"source": "offload/0", "restarts": 2, "lost": 1}, {"source": "offload/1", "restarts": 1}]},
     "offload", 4),
    ({"gaps": [{"source": "offloader/0", "restarts": 5}, {"source": "offload", "restarts": 5}]}, "offload", 0),
    ({"gaps": [{"source": "control/0", "lost": "3"}, {"restarts": 9}]}, "control", 3),
])
def test_source_ends_count_restarts_and_losses_of_a_pool(audit: dict[str, Any] | None, pool: str, ends: int) -> None:
    assert source_ends(audit, pool) == ends


# -- the client and the observer against a loopback server ----------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _app(routes: dict[str, Handler]) -> web.Application:
    app = web.Application()
    for path, handler in routes.items():
        method, _, route = path.partition(" ")
        app.router.add_route(method, route, handler)
    return app


def _with_server(routes: dict[str, Handler], body: Callable[[str, httpx.AsyncClient], Awaitable[Any]]) -> Any:
    async def run() -> Any:
        async with serving(_app(routes)) as url, httpx.AsyncClient(timeout=10.0) as http:
            return await body(url, http)

    return asyncio.run(run())


ASK = Ask("key-1", "acme-u1", [5, 6, 7], "m", 2)
Seen = list[dict[str, Any]]


def _sse(chunks: list[str], status: int = 200, headers: dict[str, str] | None = None,
         seen: Seen | None = None) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append({"body": await request.json(), "authorization": request.headers.get("authorization")})
        response = web.StreamResponse(status=status, headers=headers or {})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk.encode())
        await response.write_eof()
        return response

    return handler


def _complete(handler: Handler, ask: Ask = ASK) -> Outcome:
    outcome: Outcome = _with_server({"POST /v1/completions": handler},
                                    lambda url, http: stream_completion(http, url, ask))
    return outcome


def test_the_request_body_asks_for_a_stream_with_usage() -> None:
    assert request_body(ASK) == {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0,
                                 "user": "acme-u1", "stream": True, "stream_options": {"include_usage": True}}


def test_a_streamed_answer_gives_ttft_usage_and_the_gateway_headers() -> None:
    chunks = [": keep-alive\n\n", 'data: {"choices": []}\n\n', 'data: {"choices": [{"text": "a"}]}\n\n',
              'data: {"choices": [], "usage": {"prompt_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}}}\n\n',
              "data: [DONE]\n\n"]
    headers = {"x-kvgate-pool": "offload", "x-kvgate-overhead-ms": "1.25", "x-request-id": "r-1"}
    seen: Seen = []
    outcome = _complete(_sse(chunks, headers=headers, seen=seen))
    assert (outcome.status, outcome.error, outcome.pool, outcome.overhead_ms, outcome.request_id) == \
        (200, None, "offload", 1.25, "r-1")
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (3, 2)
    assert outcome.ttft_s is not None and 0 <= outcome.ttft_s <= outcome.total_s
    assert seen == [{"body": request_body(ASK), "authorization": "Bearer key-1"}]


@pytest.mark.parametrize(("usage", "prompt", "cached"), [
    ('{"prompt_tokens": 3}', 3, None),  # no details: unknown cached, not 0
    ('{"prompt_tokens": "3", "prompt_tokens_details": {"cached_tokens": 2.0}}', None, None),
    ('{"prompt_tokens_details": null}', None, None),
    ("null", None, None),
])
def test_usage_of_another_shape_is_unknown(usage: str, prompt: int | None, cached: int | None) -> None:
    outcome = _complete(_sse(['data: {"choices": [{"text": "a"}]}\n\n', f'data: {{"usage": {usage}}}\n\n']))
    assert (outcome.prompt_tokens, outcome.cached_tokens) == (prompt, cached)


def test_no_choice_means_no_ttft_and_an_error_event_is_kept() -> None:
    outcome = _complete(_sse(['data: {"choices": []}\n\n', 'data: {"error": {"message": "engine died"}}\n\n']))
    assert outcome.ttft_s is None and outcome.error == "engine died" and outcome.status == 200


def test_a_data_line_that_is_not_json_is_an_error_of_that_request_only() -> None:
    outcome = _complete(_sse(['data: {"choices": [{"text": "a"}]}\n\n', "data: {not json\n\n",
                              'data: {"usage": {"prompt_tokens": 3}}\n\n']))
    assert (outcome.status, outcome.error, outcome.prompt_tokens) == (200, "a data line that is not JSON", 3)
    assert outcome.ttft_s is not None


def test_an_error_status_keeps_the_start_of_its_body() -> None:
    outcome = _complete(_sse(['{"error": {"message": "slow down"}}'], status=429,
                             headers={"x-kvgate-overhead-ms": "fast"}))
    assert outcome.status == 429 and outcome.ttft_s is None and outcome.overhead_ms is None
    assert outcome.error == 'HTTP 429: {"error": {"message": "slow down"}}'


def test_a_direct_request_sends_no_key() -> None:
    seen: Seen = []
    _complete(_sse(["data: [DONE]\n\n"], seen=seen), Ask("", "u", [1], "m", 1))
    assert seen[0]["authorization"] is None


def test_nothing_listening_is_status_0_with_the_error() -> None:
    async def closed(http: httpx.AsyncClient) -> Outcome:
        return await stream_completion(http, "http://127.0.0.1:9", ASK)

    async def run() -> Outcome:
        async with httpx.AsyncClient() as http:
            return await closed(http)

    outcome = asyncio.run(run())
    assert outcome.status == 0 and outcome.ttft_s is None and (outcome.error or "").startswith("ConnectError")


CACHE_INFO = '# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{labels}}} 1.0\n'


@pytest.mark.parametrize(("labels", "tokens"), [
    ('kv_cache_size_tokens="20336",num_gpu_blocks="1271",block_size="16"', 20336),
    ('num_gpu_blocks="1271",block_size="16"', 20336),
    ('num_gpu_blocks="100"', 1600),  # block size 16 when not said
    ('num_gpu_blocks="None",block_size="16"', None),
    ('kv_cache_size_tokens="lots"', None),
    ("", None),
])
def test_the_observer_reads_the_gpu_cache_size(labels: str, tokens: int | None) -> None:
    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=CACHE_INFO.format(labels=labels) if labels else "")

    async def read(url: str, http: httpx.AsyncClient) -> int | None:
        return await Observer(http, _targets(url)).kv_cache_tokens("offload")

    assert _with_server({"GET /metrics": metrics}, read) == tokens


def test_the_observer_reads_what_answers_and_says_none_for_what_does_not() -> None:
    async def version(request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def audit(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != "Bearer admin":
            return web.json_response({}, status=403)
        return web.json_response({"tenants": {}, "gaps": []})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total 5\n")

    async def read(url: str, http: httpx.AsyncClient) -> list[Any]:
        observer = Observer(http, _targets(url, gateway=url))
        blind = Observer(http, _targets(None, gateway=url))
        return [await observer.upstream_json("offload", "/version"), await observer.upstream_json("offload", "/nope"),
                await observer.admin("/admin/audit"), await observer.admin("/admin/shadow"),
                await observer.upstream_samples("control"), await observer.settled_samples("control"),
                await observer.settled_audit(5.0), await blind.upstream_samples("offload"),
                await blind.upstream_json("offload", "/version"), observer.memory()["arms"]["offload"]]

    results = _with_server({"GET /version": version, "GET /admin/audit": audit, "GET /metrics": metrics}, read)
    assert results[:4] == [{"version": "0.32.0"}, None, {"tenants": {}, "gaps": []}, None]
    assert results[4] == results[5] == {"vllm:prompt_tokens_total": 5.0}
    assert results[6] == {"tenants": {}, "gaps": []}
    assert results[7:] == [None, None, {"pid": None, "rss_bytes": None}]
