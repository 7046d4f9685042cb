"""The whole A/B protocol (gateway.devtools.loadtest.runner.ProtocolRunner.run) against one loopback server that
plays the gateway and both upstreams with an exact prompt cache: every phase's requests, the per-request
counter deltas, restart hooks and the ledger seeing them, the direct-vs-gateway pairs, the timeline, and the
branches that skip (no hook, no control URL). Figures are counted by hand from the scenario."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiohttp import web

from gateway.devtools.loadtest.environment import describe
from gateway.devtools.loadtest.model import Scenario
from gateway.devtools.loadtest.observe import Observer
from gateway.devtools.loadtest.progress import Progress
from gateway.devtools.loadtest.runner import ProtocolRunner, RawRun
from gateway.devtools.loadtest.summary import build_report
from gateway.devtools.loadtest.targets import Access, Targets, TenantAccess, Upstream
from tests.unit.loopback import serving

USERS = {"acme-u-off": "offload", "acme-u-ctl": "control"}  # end user -> the pool the "rollout" sends it to
ADMIN = "admin-key"


@dataclass
class FakeStack:
    """The gateway's routes at /, each upstream's under /up/<arm>; one prompt cache per pool."""

    seen: dict[str, set[tuple[int, ...]]] = field(default_factory=lambda: {"offload": set(), "control": set()})
    prompt_tokens: Counter[str] = field(default_factory=Counter)
    restarts: Counter[str] = field(default_factory=Counter)
    direct_keys: list[str | None] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self._through_gateway)
        app.router.add_post("/up/{arm}/v1/completions", self._direct)
        app.router.add_get("/up/{arm}/metrics", self._metrics)
        app.router.add_get("/up/{arm}/health", self._health)
        app.router.add_get("/up/{arm}/version", self._version)
        app.router.add_get("/metrics", self._gateway_metrics)
        app.router.add_get("/admin/{what}", self._admin)
        return app

    async def _through_gateway(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        return await self._answer(request, USERS[body["user"]], body, {"x-kvgate-pool": USERS[body["user"]],
                                                                       "x-kvgate-overhead-ms": "0.5"})

    async def _direct(self, request: web.Request) -> web.StreamResponse:
        self.direct_keys.append(request.headers.get("authorization"))
        return await self._answer(request, request.match_info["arm"], await request.json(), {})

    async def _answer(self, request: web.Request, pool: str, body: dict[str, Any],
                      headers: dict[str, str]) -> web.StreamResponse:
        prompt = tuple(body["prompt"])
        cached = len(prompt) if prompt in self.seen[pool] else 0
        self.seen[pool].add(prompt)
        self.prompt_tokens[pool] += len(prompt)
        response = web.StreamResponse(headers={"content-type": "text/event-stream", **headers})
        await response.prepare(request)
        usage = {"prompt_tokens": len(prompt), "prompt_tokens_details": {"cached_tokens": cached}}
        for chunk in ({"choices": [{"text": "x"}]}, {"choices": [], "usage": usage}):
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _metrics(self, request: web.Request) -> web.Response:
        arm = request.match_info["arm"]
        return web.Response(text=f"# TYPE vllm:prompt_tokens_total counter\n"
                                 f"vllm:prompt_tokens_total {float(self.prompt_tokens[arm])}\n")

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.32.0"})

    async def _gateway_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text="# TYPE kvgate_overhead_seconds summary\nkvgate_overhead_seconds_count 0\n"
                                 "kvgate_overhead_seconds_sum 0\n")

    async def _admin(self, request: web.Request) -> web.Response:
        if request.headers.get("authorization") != f"Bearer {ADMIN}":
            return web.json_response({}, status=401)
        if request.match_info["what"] != "audit":
            return web.json_response({"version": "v1"})
        gaps = [{"source": f"{arm}/0", "restarts": self.restarts[arm], "lost": 0} for arm in ("offload", "control")]
        return web.json_response({"tenants": {"acme": {"CPU": {"stored": 1, "removed": 0, "resident": 1}}},
                                  "gaps": gaps})


@dataclass
class CountingRestart:
    """A restart hook: the "upstream" comes back at once, and the audit then reports one more restart (unless
    the ledger is `blind` to this arm's restarts)."""

    stack: FakeStack
    arm: str
    blind: bool = False

    def restart(self, timeout_s: float) -> None:
        if not self.blind:
            self.stack.restarts[self.arm] += 1


SCENARIO = Scenario.model_validate({
    "name": "loop", "tenants": [{"name": "acme"}], "arms": {"offload": {"pool": "offload"},
                                                           "control": {"pool": "control"}},
    "prefix_tokens": 40, "max_tokens": 1, "pressure": {"prompts": 2, "tokens": 40}, "repetitions": 1,
    "warmup_repetitions": 1, "overhead_pairs": 1, "vocab_size": 100, "timeouts": {"ledger_s": 10.0}})


def _run(stack: FakeStack, hooks: bool, control_url: bool = True, scenario: Scenario = SCENARIO,
         blind: tuple[str, ...] = ()) -> tuple[RawRun, str]:
    notes = io.StringIO()

    async def run() -> RawRun:
        async with serving(stack.app()) as url, httpx.AsyncClient(timeout=30.0) as http:
            upstreams = {arm: Upstream(arm, f"{url}/up/{arm}" if arm == "offload" or control_url else None,
                                       restart_hook=CountingRestart(stack, arm, arm in blind) if hooks else None)
                         for arm in ("offload", "control")}
            access = Access(ADMIN, {"acme": TenantAccess("acme-key", {"offload": "acme-u-off",
                                                                     "control": "acme-u-ctl"})})
            targets = Targets(url, access, upstreams, "loopback")
            runner = ProtocolRunner(scenario, targets, http, {"mode": "loopback"}, 2, Progress(0, notes))
            runner.progress = Progress(runner.total_steps(), notes)
            return await runner.run()

    return asyncio.run(run()), notes.getvalue()


def _kinds(raw: RawRun) -> Counter[tuple[str, str, bool]]:
    return Counter((row["phase"], row["role"], row["warmup"]) for row in raw.requests)


def test_the_whole_protocol_with_restart_hooks() -> None:
    stack = FakeStack()
    raw, notes = _run(stack, hooks=True)
    # per repetition and arm: 1 cold, 1 repeat, 2 pressure, 1 return; a warm-up repetition and a measured one;
    # then per arm a probe and a restart prefix; then one direct-vs-gateway pair
    assert _kinds(raw) == Counter({("cold", "prefix", True): 2, ("repeat", "prefix", True): 2,
                                   ("pressure", "pressure", True): 4, ("return", "prefix", True): 2,
                                   ("cold", "prefix", False): 2, ("repeat", "prefix", False): 2,
                                   ("pressure", "pressure", False): 4, ("return", "prefix", False): 2,
                                   ("restart", "probe", True): 2, ("restart", "prefix", False): 2,
                                   ("overhead", "direct", False): 1, ("overhead", "gateway", False): 1})
    assert all(row["status"] == 200 and row["error"] is None and not row["misrouted"] for row in raw.requests)
    measured = [row for row in raw.requests if not row["warmup"] and row["phase"] != "overhead"]
    cached = {(row["phase"], row["arm"]): row["cached_tokens"] for row in measured if row["role"] == "prefix"}
    assert cached[("cold", "offload")] == 0 and cached[("repeat", "offload")] == 40  # the exact cache
    assert cached[("return", "control")] == 40 and cached[("restart", "offload")] == 40
    deltas = [row["upstream_delta"]["vllm:prompt_tokens_total"] for row in measured]
    assert deltas == [40.0] * len(measured)  # concurrency 1: each measured request's own counter change
    assert all(row["upstream_delta"] is None for row in raw.requests if row["warmup"])  # warm-up is not measured
    assert raw.upstream_metrics_delta["offload"]["pressure"]["vllm:prompt_tokens_total"] == 80.0
    assert [(r["arm"], r["ok"], r["error"]) for r in raw.restarts] == [("offload", True, None),
                                                                        ("control", True, None)]
    assert raw.ledger_restart["observed"] is True and raw.ledger_restart["pools"] == ["offload", "control"]
    assert raw.ledger_restart["after"]["gaps"][0]["restarts"] == 1
    assert stack.direct_keys == [None]  # the direct baseline carries no gateway key
    labels = [point["label"] for point in raw.timeline]
    assert labels[0] == "start" and labels[-1] == "end"
    assert labels.index("before restart") < labels.index("after restart") < labels.index("restart rep 0")
    assert "cold rep -1" in labels and "return rep 0" in labels
    assert raw.audit_final is not None and raw.shadow_final == {"version": "v1"}
    assert raw.finished_at is not None and raw.finished_at >= raw.started_at
    assert "warm-up rep -1 cold: " in notes and "direct-vs-gateway baseline: 1 pairs" in notes
    report = build_report(raw)
    assert report["gateway_overhead"]["direct_vs_gateway"]["pairs"] == 1
    assert report["verdict"]["acme"].startswith("acme: no, the CPU tier did not serve the return; the pressure did "
                                                "not evict the prefix")


def test_without_hooks_the_restart_is_skipped_and_without_a_control_url_the_pairs_are() -> None:
    stack = FakeStack()
    raw, notes = _run(stack, hooks=False, control_url=False)
    kinds = _kinds(raw)
    assert not any(phase in ("restart", "overhead") for phase, _, _ in kinds)
    assert sum(kinds.values()) == 20
    assert raw.ledger_restart == {"skipped": "no restart hook"} and raw.restarts == []
    assert "restart skipped: no upstream has a restart hook (--restart-cmd ARM=CMD)" in notes
    assert "direct-vs-gateway baseline skipped: no --upstream URL for the control arm" in notes
    assert "control" not in raw.upstream_metrics_delta  # its /metrics could not be read: not a 0
    assert all(row["upstream_delta"] is None for row in raw.requests if row["arm"] == "control")


def test_a_restart_the_ledger_does_not_see_on_every_pool_is_not_observed() -> None:
    """Both upstreams restart, but the audit reports only the offload pool's: within the (short) limit the ledger
    is said not to have seen the restart, rather than being credited for one pool."""
    scenario = SCENARIO.model_copy(update={"phases": ["cold", "restart"], "warmup_repetitions": 0,
                                           "overhead_pairs": 0,
                                           "timeouts": SCENARIO.timeouts.model_copy(update={"ledger_s": 0.5})})
    raw, _ = _run(FakeStack(), hooks=True, scenario=scenario, blind=("control",))
    assert [r["ok"] for r in raw.restarts] == [True, True]
    assert raw.ledger_restart["observed"] is False


def test_the_environment_records_versions_policy_and_revision() -> None:
    stack = FakeStack()

    async def described() -> dict[str, Any]:
        async with serving(stack.app()) as url, httpx.AsyncClient(timeout=30.0) as http:
            upstreams = {"offload": Upstream("offload", f"{url}/up/offload", restart_hook=CountingRestart(stack, "x")),
                         "control": Upstream("control", None)}
            access = Access(ADMIN, {"acme": TenantAccess("k", {"offload": "acme-u-off", "control": "acme-u-ctl"})})
            targets = Targets(url, access, upstreams, "loopback")
            return await describe(Observer(http, targets), SCENARIO, targets)

    environment = asyncio.run(described())
    assert environment["upstream_versions"] == {"offload": "0.32.0", "control": None}
    assert environment["kv_cache_tokens"] == {"offload": None, "control": None}  # no cache_config_info: unknown
    assert environment["policy_version"] == "v1" and environment["mode"] == "loopback"
    assert environment["users"] == {"acme": {"offload": "acme-u-off", "control": "acme-u-ctl"}}
    assert environment["restart_hooks"] == {"offload": "CountingRestart", "control": None}
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False).stdout.strip()
    if head:  # a git checkout: the revision is HEAD, marked when the tree has changes
        assert environment["source_revision"] in (head, f"{head}+dirty")
