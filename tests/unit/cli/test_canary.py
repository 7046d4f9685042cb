"""The isolation canary: the pure probe (gateway.canary.probe), the runner against a real upstream on loopback
that either keeps cache salts apart or leaks across them (gateway.canary.runner), and `kvgate canary`'s output
and exit status against a real HTTP answer (gateway.cli.canary)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gateway.canary.probe import (
    IDENTITY_A,
    IDENTITY_B,
    Outcome,
    Probe,
    Result,
    external_hits,
    judge,
    random_prefix,
)
from gateway.canary.runner import CanaryRunner
from gateway.cli.main import main
from gateway.policy.loader import PolicySet, load_policy_set
from gateway.policy.model import PoolConfig
from gateway.proxy.smallcalls import SmallCalls
from gateway.tasks import TaskSupervisor
from tests.harness import PolicyDir
from tests.unit.loopback import serving, serving_in_thread

SECRET = b"canary-test-secret-0123456789abcdef"


@pytest.mark.parametrize(("cached_b", "external", "result"), [
    (0, None, Result.PASS), (0, 0.0, Result.PASS), (0, -3.0, Result.PASS),
    (0, 0.5, Result.INCONCLUSIVE), (0, 100.0, Result.INCONCLUSIVE),
    (1, None, Result.FAIL), (1, 100.0, Result.FAIL), (4096, 0.0, Result.FAIL),
])
def test_judge(cached_b: int, external: float | None, result: Result) -> None:
    assert judge(cached_b, external) is result


@pytest.mark.parametrize(("text", "total"), [
    ("", None),
    ("# HELP x\nvllm:num_requests_running 3\n", None),
    ('vllm:external_prefix_cache_hits_total{engine="0"} 12.0\n', 12.0),
    ('vllm:external_prefix_cache_hits_total{engine="0"} 12\nvllm:external_prefix_cache_hits_total{engine="1"} 3\n',
     15.0),
    ("lmcache:num_hit_tokens_total 7\nvllm:external_prefix_cache_hits_total 1\n", 8.0),
    ("vllm:external_prefix_cache_hits_total 0\n", 0.0),  # present and zero is 0, not unknown
    ("vllm:external_prefix_cache_hits_total\nvllm:external_prefix_cache_hits_total abc\n", None),
    ("vllm:external_prefix_cache_hits_created 1.7e9\n", None),
    ("vllm:external_prefix_cache_hits_total_x 5\n", None),
    ('vllm:external_prefix_cache_hits_total{engine="0"} 12 1700000000000\n', 12.0),  # a timestamp may follow
    ("vllm:external_prefix_cache_hits_total 3 1700000000000\n", 3.0),
    ('vllm:external_prefix_cache_hits_total{model_name="my model",x="a}b"} 4\n', 4.0),
])
def test_external_hits(text: str, total: float | None) -> None:
    assert external_hits(text) == total


@pytest.mark.parametrize(("tokens", "words"), [(0, 1), (1, 1), (2, 1), (3, 1), (1024, 512), (32768, 16384)])
def test_random_prefixes_have_the_word_count_and_are_fresh(tokens: int, words: int) -> None:
    first, second = random_prefix(tokens), random_prefix(tokens)
    assert len(first.split(" ")) == words and all(len(word) == 6 for word in first.split(" "))
    assert first != second


def _hmac(identity: str) -> str:
    return hmac.new(SECRET, f"{identity}:0".encode(), hashlib.sha256).hexdigest()


def test_the_probe_body_carries_the_identity_salt_and_asks_one_token() -> None:
    probe = Probe("abc def", "m")
    body = probe.body(IDENTITY_A, SECRET, PoolConfig(upstreams=["http://u"]))
    assert body == {"model": "m", "prompt": "abc def", "max_tokens": 1, "temperature": 0,
                    "cache_salt": _hmac("~canary-a")}
    other = probe.body(IDENTITY_B, SECRET, PoolConfig(upstreams=["http://u"]))
    assert other["cache_salt"] == _hmac("~canary-b") != body["cache_salt"]


def test_an_lmcache_pool_probe_also_carries_transfer_params() -> None:
    body = Probe("p", "m").body(IDENTITY_A, SECRET, PoolConfig(upstreams=["http://u"], connector="lmcache"))
    assert isinstance(body["kv_transfer_params"], dict) and body["kv_transfer_params"]
    assert body["cache_salt"] == _hmac("~canary-a")


def test_an_outcome_view_is_json_ready() -> None:
    view = Outcome("main", "http://u", Result.FAIL, 10, 5, 2.0, "d", 3.0).view()
    assert view == {"pool": "main", "upstream": "http://u", "result": "fail", "cached_tokens_a": 10,
                    "cached_tokens_b": 5, "external_hits_delta_b": 2.0, "detail": "d", "at": 3.0}
    assert json.loads(json.dumps(view)) == view


# -- the runner against a real upstream -----------------------------------------------------------------------


@dataclass
class CacheUpstream:
    """An upstream whose prefix cache is keyed by (salt, prompt), or by prompt alone when it `leaks`."""

    mode: str = "isolated"  # isolated | leaky | no_usage | float_cached | bool_cached | status500 | bad_json
    metrics: bool = True
    hits: float = 0.0
    seen: set[tuple[str, str]] = field(default_factory=set)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorization: list[str | None] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "served-model"}]})

    async def _complete(self, request: web.Request) -> web.Response:
        self.authorization.append(request.headers.get("authorization"))
        if self.mode == "status500":
            return web.json_response({"error": {"message": "down"}}, status=500)
        if self.mode == "bad_json":
            return web.Response(text="not json", content_type="application/json")
        body = await request.json()
        self.bodies.append(body)
        key = (body["cache_salt"] if self.mode != "leaky" else "", body["prompt"])
        cached = 100 if key in self.seen else 0
        self.seen.add(key)
        if cached:
            self.hits += cached
        usage: dict[str, Any] = {"prompt_tokens": 120}
        shapes: dict[str, Any] = {"float_cached": float(cached), "bool_cached": bool(cached)}
        if self.mode != "no_usage":
            usage["prompt_tokens_details"] = {"cached_tokens": shapes.get(self.mode, cached)}
        return web.json_response({"choices": [{"text": "x"}], "usage": usage})

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.metrics:
            return web.Response(status=404)
        return web.Response(text=f'vllm:external_prefix_cache_hits_total{{engine="0"}} {self.hits}\n')


@dataclass
class Probed:
    outcomes: list[Outcome]
    canary: CanaryRunner
    policies: PolicySet
    registry: CollectorRegistry

    def count(self, result: str) -> float | None:
        """The counter as Prometheus would scrape it."""
        return self.registry.get_sample_value("kvgate_isolation_canary_total", {"pool": "main", "result": result})


async def _probe(upstream: CacheUpstream, tmp_path: Path, **pool: Any) -> Probed:
    async with serving(upstream.app()) as url:
        directory = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [url], **pool}})
        directory.add_tenant("acme")
        policies = load_policy_set(directory.write(), environ={"POOL_KEY": "pool-secret"})
        registry = CollectorRegistry()
        async with aiohttp.ClientSession() as session:
            canary = CanaryRunner(SmallCalls.using(session), SECRET, registry, clock=lambda: 1234.0)
            canary.prime(policies)
            outcomes = await canary.run_pool(policies, "main")
        return Probed(outcomes, canary, policies, registry)


def test_an_isolating_upstream_passes(tmp_path: Path) -> None:
    upstream = CacheUpstream()
    probed = asyncio.run(_probe(upstream, tmp_path))
    (outcome,) = probed.outcomes
    assert (outcome.result, outcome.cached_a, outcome.cached_b, outcome.external_hits_delta) == \
        (Result.PASS, 0, 0, 0.0)
    assert outcome.at == 1234.0
    first, second = upstream.bodies
    assert first["prompt"] == second["prompt"] and first["model"] == "served-model"
    assert (first["cache_salt"], second["cache_salt"]) == (_hmac("~canary-a"), _hmac("~canary-b"))
    assert [probed.count(r) for r in ("pass", "fail", "inconclusive", "error")] == [1.0, 0.0, 0.0, 0.0]
    latest = probed.canary.summary(probed.policies)["main"]["latest"]
    assert [entry["result"] for entry in latest] == ["pass"]


def test_a_leaking_upstream_fails(tmp_path: Path) -> None:
    probed = asyncio.run(_probe(CacheUpstream(mode="leaky"), tmp_path))
    (outcome,) = probed.outcomes
    assert (outcome.result, outcome.cached_b, outcome.external_hits_delta) == (Result.FAIL, 100, 100.0)
    assert probed.count("fail") == 1.0


def test_without_metrics_a_zero_cached_answer_still_passes_with_unknown_hits(tmp_path: Path) -> None:
    (outcome,) = asyncio.run(_probe(CacheUpstream(metrics=False), tmp_path)).outcomes
    assert outcome.result is Result.PASS and outcome.external_hits_delta is None


@pytest.mark.parametrize(("mode", "detail"), [
    ("no_usage", "ValueError: no usage.prompt_tokens_details.cached_tokens"),
    ("float_cached", "ValueError: no usage.prompt_tokens_details.cached_tokens"),  # 0.0 is not read as 0 cached
    ("bool_cached", "ValueError: no usage.prompt_tokens_details.cached_tokens"),
    ("status500", "ClientResponseError: 500"),
    ("bad_json", "DecodeError"),
])
def test_an_upstream_that_cannot_answer_is_an_error_not_a_pass(tmp_path: Path, mode: str, detail: str) -> None:
    probed = asyncio.run(_probe(CacheUpstream(mode=mode), tmp_path))
    (outcome,) = probed.outcomes
    assert outcome.result is Result.ERROR and outcome.detail.startswith(detail)
    assert outcome.cached_b is None and probed.count("error") == 1.0 and probed.count("pass") == 0.0


def test_the_pool_key_and_the_configured_model_are_used(tmp_path: Path) -> None:
    upstream = CacheUpstream()
    (outcome,) = asyncio.run(_probe(upstream, tmp_path, api_key_env="POOL_KEY",
                                    canary={"model": "named", "prefix_tokens": 256})).outcomes
    assert outcome.result is Result.PASS
    assert upstream.authorization == ["Bearer pool-secret", "Bearer pool-secret"]
    assert upstream.bodies[0]["model"] == "named"
    assert len(upstream.bodies[0]["prompt"].split(" ")) == 128


def test_nothing_listening_is_an_error(tmp_path: Path) -> None:
    async def probe_closed() -> Outcome:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        directory = PolicyDir(tmp_path / "p", {"main": {"upstreams": [f"http://127.0.0.1:{port}"]}})
        directory.add_tenant("acme")
        policies = load_policy_set(directory.write(), environ={})
        async with aiohttp.ClientSession() as session:
            canary = CanaryRunner(SmallCalls.using(session), SECRET, CollectorRegistry())
            (outcome,) = await canary.run_pool(policies, "main")
        return outcome

    outcome = asyncio.run(probe_closed())
    assert outcome.result is Result.ERROR and outcome.detail.startswith("ClientConnectorError")


# -- kvgate canary --------------------------------------------------------------------------------------------


@dataclass
class AdminAnswer:
    status: int = 200
    outcomes: list[dict[str, Any]] = field(default_factory=list)
    requests: list[tuple[str, str | None]] = field(default_factory=list)


@pytest.fixture
def gateway() -> Iterator[tuple[str, AdminAnswer]]:
    answer = AdminAnswer()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            answer.requests.append((self.path, self.headers.get("authorization")))
            body = json.dumps({"outcomes": answer.outcomes}).encode() if answer.status == 200 else b"nope"
            self.send_response(answer.status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet."""

    with serving_in_thread(Handler) as url:
        yield url, answer


def _outcome(result: str, upstream: str = "http://u") -> dict[str, Any]:
    return Outcome("main", upstream, Result(result), 10, 0, None).view()


@pytest.mark.parametrize(("results", "status"), [
    (["pass"], 0), (["pass", "pass"], 0), (["pass", "fail"], 1), (["fail", "error"], 1),
    (["pass", "inconclusive"], 2), (["error"], 2), ([], 2),
])
def test_the_exit_status_follows_the_worst_result(gateway: tuple[str, AdminAnswer], monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], results: list[str],
                                                  status: int) -> None:
    url, answer = gateway
    answer.outcomes = [_outcome(result, f"http://u{i}") for i, result in enumerate(results)]
    monkeypatch.setenv("KVGATE_ADMIN_KEY", "admin-key")
    assert main(["canary", "--url", url + "/", "--pool", "main"]) == status
    assert answer.requests == [("/admin/canary?pool=main", "Bearer admin-key")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["pool", "upstream", "result", "cached_tokens_a", "cached_tokens_b",
                                "external_hits_delta_b"]
    assert [line.split()[2] for line in lines[2:]] == results
    assert all(line.split()[-1] == "-" for line in lines[2:])  # unknown external hits print as "-", not 0


def test_without_a_key_nothing_is_asked(gateway: tuple[str, AdminAnswer], monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    url, answer = gateway
    monkeypatch.delenv("KVGATE_ADMIN_KEY", raising=False)
    assert main(["canary", "--url", url]) == 2
    assert "set KVGATE_ADMIN_KEY" in capsys.readouterr().err and answer.requests == []


def test_a_refusal_or_no_gateway_is_status_2(gateway: tuple[str, AdminAnswer], monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    url, answer = gateway
    monkeypatch.setenv("KVGATE_ADMIN_KEY", "k")
    answer.status = 403
    assert main(["canary", "--url", url]) == 2
    assert "gateway answered 403: nope" in capsys.readouterr().err
    assert answer.requests == [("/admin/canary", "Bearer k")]  # no pool: every pool
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    assert main(["canary", "--url", closed, "--timeout", "5"]) == 2
    assert "could not reach the gateway: ConnectError" in capsys.readouterr().err


def test_the_schedule_probes_only_pools_with_an_interval_once_it_has_passed(tmp_path: Path) -> None:
    """A clock under the test's control: `main` (every 60 s) is probed at once, not again while the clock reads
    +59 s (over several ticks, counted by the clock's reads), and again at +60 s; `quiet` (no interval) never."""
    upstream = CacheUpstream()
    now = [1000.0]
    reads = [0]

    def clock() -> float:
        reads[0] += 1
        return now[0]

    async def scheduled() -> tuple[list[Outcome], int]:
        async with serving(upstream.app()) as url, aiohttp.ClientSession() as session:
            directory = PolicyDir(tmp_path / "policies", {"main": {"upstreams": [url], "canary": {"interval_s": 60}},
                                                          "quiet": {"upstreams": [url]}})
            directory.add_tenant("acme")
            policies = load_policy_set(directory.write(), environ={})
            canary = CanaryRunner(SmallCalls.using(session), SECRET, CollectorRegistry(), clock=clock, tick_s=0.001)
            tasks = TaskSupervisor("canary-test")
            try:
                tasks.spawn(canary.schedule(lambda: policies), "schedule")
                await _until(lambda: len(upstream.bodies) == 2)
                now[0] = 1059.0
                seen = reads[0]
                await _until(lambda: reads[0] >= seen + 20)  # ten ticks or more at +59 s
                bodies_at_59 = len(upstream.bodies)
                now[0] = 1060.0
                # The upstream sees the fourth probe before the runner has recorded its outcome: wait for both.
                await _until(lambda: len(upstream.bodies) == 4
                             and any(outcome.at == 1060.0 for outcome in canary.latest.values()))
            finally:
                await tasks.close()
            return [canary.latest[key] for key in sorted(canary.latest)], bodies_at_59

    latest, bodies_at_59 = asyncio.run(scheduled())
    assert bodies_at_59 == 2  # nothing at +59 s
    assert [(o.pool, o.result, o.at) for o in latest] == [("main", Result.PASS, 1060.0)]
    assert len(upstream.bodies) == 4  # two probes of A then B, none of `quiet`


async def _until(condition: Callable[[], bool], limit_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "the schedule did not probe in time"
        await asyncio.sleep(0.005)  # polling an observable condition, not synchronisation
