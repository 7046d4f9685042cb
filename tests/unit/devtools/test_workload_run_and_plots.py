"""Replaying a reuse workload (gateway.devtools.loadtest.workload_run) against a real loopback server that plays
gateway and upstream with an exact prefix cache, and the PNG plots of a report and a plan (which plots are drawn,
and why the others are not)."""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from gateway.devtools.loadtest.plots import PLOT_NAMES, draw_all
from gateway.devtools.loadtest.summary import build_report
from gateway.devtools.loadtest.workload_run import MEASURED, WorkloadResult, WorkloadTarget, run_workload
from gateway.devtools.loadtest.workloads import HotSetWorkload, WorkloadSpec, generate
from gateway.plan.build import PlanInputs, build_plan
from gateway.plan.plot import draw_curve
from tests.unit.devtools.runs import hand_run
from tests.unit.loopback import serving
from tests.unit.plan.traces import doc_twice

PNG = b"\x89PNG\r\n\x1a\n"


@dataclass
class PromptCache:
    """Answers completions with an exact whole-prompt cache, counts like vLLM, and refuses every `refuse_every`th."""

    refuse_every: int = 0
    odd_every: int = 0  # every n-th answer is a 200 of another shape
    seen: set[tuple[int, ...]] = field(default_factory=set)
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MEASURED, 0.0))
    calls: int = 0
    keys: list[str | None] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def _complete(self, request: web.Request) -> web.Response:
        self.calls += 1
        self.keys.append(request.headers.get("authorization"))
        if self.refuse_every and self.calls % self.refuse_every == 0:
            return web.json_response({"error": {"message": "busy"}}, status=429)
        if self.odd_every and self.calls % self.odd_every == 0:
            odd = ["not json", "[1, 2]", '{"usage": [1]}', '{"usage": {"prompt_tokens": "30", '
                   '"prompt_tokens_details": {"cached_tokens": true}}}']
            return web.Response(text=odd[(self.calls // self.odd_every) % len(odd)], content_type="application/json")
        prompt = tuple((await request.json())["prompt"])
        cached = len(prompt) if prompt in self.seen else 0
        self.seen.add(prompt)
        self.counters["vllm:prompt_tokens_total"] += len(prompt)
        self.counters["vllm:prefix_cache_hits_total"] += cached
        return web.json_response({"usage": {"prompt_tokens": len(prompt),
                                            "prompt_tokens_details": {"cached_tokens": cached}}})

    async def _metrics(self, request: web.Request) -> web.Response:
        lines = [f"# TYPE {name} counter\n{name} {value}\n" for name, value in self.counters.items()]
        return web.Response(text="".join(lines))


SPEC = WorkloadSpec(shape=HotSetWorkload(hot_docs=2, doc_tokens=30, one_off_share=0.0, question_tokens=0),
                    requests=12)


def _replay(server: PromptCache, spec: WorkloadSpec, metrics: bool = True) -> WorkloadResult:
    async def run() -> WorkloadResult:
        async with serving(server.app()) as url, httpx.AsyncClient(timeout=10.0) as http:
            target = WorkloadTarget(url, "key-1", "m", 1, f"{url}/metrics" if metrics else None)
            return await run_workload(http, target, spec)

    return asyncio.run(run())


def test_a_hot_set_is_measured_from_the_counters_and_the_usage() -> None:
    """Two 30-token documents with no question: every request after a document's first is a whole-prompt hit."""
    firsts = len({r.label for r in generate(SPEC)})  # each document's first request misses
    result = _replay(PromptCache(), SPEC)
    assert (result.requests, result.failures) == (12, 0)
    assert result.upstream_delta["vllm:prompt_tokens_total"] == 360.0
    assert result.gpu_share == pytest.approx((12 - firsts) / 12)
    assert result.cpu_share == 0.0  # the counter exists and did not move: a measured 0
    assert result.usage_cached_share == pytest.approx((12 - firsts) / 12)
    labels = [r.label for r in generate(SPEC)]
    assert result.per_request == [(30, 30 if label in labels[:i] else 0) for i, label in enumerate(labels)]
    assert result.started_at <= result.finished_at


def test_refused_requests_are_counted_and_left_out_of_the_usage() -> None:
    server = PromptCache(refuse_every=3)
    result = _replay(server, SPEC)
    assert (result.requests, result.failures, len(result.per_request)) == (12, 4, 8)
    assert result.usage_prompt_tokens == 8 * 30
    assert server.keys == ["Bearer key-1"] * 12


def test_answers_of_another_shape_count_as_no_usage_not_as_a_crash() -> None:
    result = _replay(PromptCache(odd_every=2), SPEC)
    assert (result.requests, result.failures, len(result.per_request)) == (12, 0, 12)
    assert result.per_request[1::2] == [(0, 0)] * 6  # the odd answers: no usable usage
    assert result.usage_prompt_tokens == 6 * 30


def test_without_metrics_the_shares_are_unknown_but_usage_is_kept() -> None:
    result = _replay(PromptCache(), SPEC, metrics=False)
    assert result.upstream_delta == {} and result.gpu_share is None and result.cpu_share is None
    assert result.prompt_tokens == 360.0 and result.usage_cached_share is not None


# -- plots ----------------------------------------------------------------------------------------------------


def test_the_hand_report_draws_every_plot(tmp_path: Path) -> None:
    report = build_report(hand_run())
    report["memory"] = [{"t": 10.0, "arms": {"offload": {"rss_bytes": 2e9}, "control": {"rss_bytes": 1e9}}},
                        {"t": 20.0, "arms": {"offload": {"rss_bytes": 3e9}}}]
    report["restart"] = {"restarts": [{"finished_at": 15.0}]}
    status = draw_all(report, tmp_path)
    assert status == dict.fromkeys(PLOT_NAMES, "ok")
    assert all((tmp_path / name).read_bytes()[:8] == PNG for name in PLOT_NAMES)


def test_an_empty_report_says_why_each_plot_is_missing(tmp_path: Path) -> None:
    report = build_report(hand_run())
    report = {**copy.deepcopy(report), "phases": {}, "upstream_metrics_delta": {}, "ledger_timeline": []}
    assert draw_all(report, tmp_path) == {
        "ttft_by_phase.png": "no data: no measured phase",
        "delta_ttft_by_tenant.png": "no data: no per-tenant phases",
        "offload_bytes_by_phase.png": "no data: the offload upstream's /metrics was not read",
        "ledger_cpu_resident.png": "no data: the audit was not read",
        "memory_rss.png": "no data: no upstream PID was known",
    }
    assert list(tmp_path.iterdir()) == []


def test_a_plan_without_a_curve_cannot_be_drawn(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no curve to draw"):
        draw_curve(build_plan(doc_twice(), PlanInputs()), tmp_path / "c.png")
    assert not (tmp_path / "c.png").exists()


def test_a_plan_in_tokens_only_is_drawn_on_a_token_axis(tmp_path: Path) -> None:
    plan: dict[str, Any] = build_plan(doc_twice(), PlanInputs(gpu_kv_tokens=16, block_size=16))
    assert plan["curve"][0]["cpu_bytes"] is None
    draw_curve(plan, tmp_path / "c.png")
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG
