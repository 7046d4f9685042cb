"""The protocol: per repetition `cold`, `repeat`, `pressure`, `return` on both arms, then one `restart`.

- cold: each tenant sends a fresh long prefix P (nothing cached anywhere);
- repeat: P again (a GPU prefix-cache hit on both arms);
- pressure: other long prompts, spread over the tenants, until P must have left the GPU cache;
- return: P again: the offload arm can load it from the CPU tier, the control arm recomputes it;
- restart: every upstream with a restart hook is restarted, then the prefixes are sent once more.

Arms run one after the other within a phase (they may share one GPU), in alternating order per repetition.
Each upstream's `/metrics` is read before and after each measured phase and, at concurrency 1, around each
request; the gateway's `/metrics` around each phase; the ledger's audit and host memory after each phase.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from gateway.devtools.loadtest.client import Ask, Outcome, stream_completion
from gateway.devtools.loadtest.model import ARMS, REPEATED_PHASES, Scenario
from gateway.devtools.loadtest.observe import Observer
from gateway.devtools.loadtest.progress import Progress
from gateway.devtools.loadtest.prompts import PromptBook
from gateway.devtools.loadtest.promtext import Samples, add_into, delta
from gateway.devtools.loadtest.targets import Targets, wait_healthy


@dataclass(frozen=True)
class Step:
    tenant: str
    role: str  # prefix | pressure | probe
    rep: int
    prompt: list[int]


@dataclass
class RawRun:
    """Everything measured, JSON-ready; `gateway.devtools.loadtest.summary` turns it into the report."""

    scenario: dict[str, Any]
    environment: dict[str, Any]
    pressure_prompts: int
    requests: list[dict[str, Any]] = field(default_factory=list)
    upstream_metrics_delta: dict[str, dict[str, Samples]] = field(default_factory=dict)
    gateway_metrics_delta: dict[str, Samples] = field(default_factory=dict)
    timeline: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    ledger_restart: dict[str, Any] = field(default_factory=dict)
    audit_final: dict[str, Any] | None = None
    shadow_final: dict[str, Any] | None = None
    gateway_run_delta: Samples = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class ProtocolRunner:
    def __init__(self, scenario: Scenario, targets: Targets, http: httpx.AsyncClient, environment: dict[str, Any],
                 pressure_prompts: int, progress: Progress) -> None:
        self.scenario = scenario
        self.targets = targets
        self.http = http
        self.observer = Observer(http, targets)
        self.progress = progress
        self.book = PromptBook(scenario.seed, scenario.vocab_size, scenario.prefix_tokens, scenario.pressure.tokens)
        self.raw = RawRun(scenario.model_dump(mode="json"), environment, pressure_prompts)

    # -- the plan ------------------------------------------------------------------------------------

    def reps(self) -> range:
        return range(-self.scenario.warmup_repetitions, self.scenario.repetitions)

    def phase_steps(self, phase: str, rep: int) -> list[Step]:
        tenants = self.scenario.tenant_names
        if phase == "pressure":
            return [Step(tenants[i % len(tenants)], "pressure", rep, self.book.pressure(rep, i))
                    for i in range(self.raw.pressure_prompts)]
        return [Step(tenant, "prefix", rep, self.book.prefix(tenant, rep)) for tenant in tenants]

    def restart_steps(self) -> list[Step]:
        count = self.scenario.restart_samples or self.scenario.repetitions
        reps = list(range(self.scenario.repetitions))[-count:]
        return [Step(tenant, "prefix", rep, self.book.prefix(tenant, rep))
                for rep in reps for tenant in self.scenario.tenant_names]

    def total_steps(self) -> int:
        per_rep = sum(len(self.phase_steps(phase, 0)) for phase in REPEATED_PHASES if phase in self.scenario.phases)
        total = per_rep * len(ARMS) * len(self.reps())
        if "restart" in self.scenario.phases:
            total += len(ARMS) * (2 + len(self.restart_steps()))
        return total + 2 * self.scenario.overhead_pairs

    def arm_order(self, rep: int) -> list[str]:
        return list(ARMS) if rep % 2 == 0 else list(reversed(ARMS))

    # -- running -------------------------------------------------------------------------------------

    async def run(self) -> RawRun:
        gateway_start = await self.observer.gateway_samples()
        await self._sample("start", None, None)
        for rep in self.reps():
            for phase in REPEATED_PHASES:
                if phase in self.scenario.phases:
                    await self._phase(phase, rep, self.phase_steps(phase, rep), self.arm_order(rep))
        if "restart" in self.scenario.phases:
            await self._restart_phase()
        if self.scenario.overhead_pairs:
            await self._overhead_pairs()
        self.raw.audit_final = await self.observer.settled_audit(self.scenario.timeouts.ledger_s)
        self.raw.shadow_final = await self.observer.admin("/admin/shadow")
        gateway_end = await self.observer.gateway_samples()
        if gateway_start is not None and gateway_end is not None:
            self.raw.gateway_run_delta = delta(gateway_start, gateway_end, ())
        await self._sample("end", None, None)
        self.raw.finished_at = time.time()
        return self.raw

    async def _phase(self, phase: str, rep: int, steps: list[Step], order: list[str]) -> None:
        measured = rep >= 0
        before = {arm: await self.observer.upstream_samples(arm) for arm in order} if measured else {}
        gateway_before = await self.observer.gateway_samples() if measured else None
        for arm in order:
            await self._run_arm(arm, phase, steps, measured)
        if measured:
            for arm in order:
                after = await self.observer.settled_samples(arm)
                if before[arm] is not None and after is not None:
                    add_into(self.raw.upstream_metrics_delta.setdefault(arm, {}).setdefault(phase, {}),
                             delta(before[arm] or {}, after))
            gateway_after = await self.observer.gateway_samples()
            if gateway_before is not None and gateway_after is not None:
                add_into(self.raw.gateway_metrics_delta.setdefault(phase, {}), delta(gateway_before, gateway_after, ()))
        await self._sample(f"{phase} rep {rep}", phase, rep)
        self.progress.note(self._phase_line(phase, rep))

    async def _run_arm(self, arm: str, phase: str, steps: list[Step], measured: bool) -> None:
        limit = asyncio.Semaphore(self.scenario.concurrency)
        per_request = measured and self.scenario.concurrency == 1

        async def bounded(step: Step) -> None:
            async with limit:
                await self._send(arm, phase, step, measured, per_request)

        await asyncio.gather(*(bounded(step) for step in steps))

    async def _send(self, arm: str, phase: str, step: Step, measured: bool, per_request: bool) -> None:
        access = self.targets.access.tenants[step.tenant]
        ask = Ask(access.key, access.users[arm], step.prompt, self.scenario.model, self.scenario.max_tokens)
        before = await self.observer.upstream_samples(arm) if per_request else None
        outcome = await self._request(self.targets.gateway_url, ask)
        after = await self.observer.settled_samples(arm) if per_request else None
        row = self._row(arm, phase, step, measured, outcome)
        if before is not None and after is not None:
            row["upstream_delta"] = delta(before, after)
        self.raw.requests.append(row)
        ttft = f"{outcome.ttft_s * 1000:.0f} ms" if outcome.ttft_s is not None else (outcome.error or "no TTFT")
        self.progress.step(f"rep {step.rep} {phase} {arm} {step.tenant}: {ttft}")

    async def _request(self, base_url: str, ask: Ask) -> Outcome:
        """One request, bounded in time; a request that outlives the limit is recorded as failed."""
        started_at, started = time.time(), time.perf_counter()
        limit_s = self.scenario.timeouts.request_s
        try:
            return await asyncio.wait_for(stream_completion(self.http, base_url, ask), limit_s)
        except TimeoutError:
            return Outcome(0, None, time.perf_counter() - started, started_at, None, None, None, None, None,
                           error=f"no complete answer within {limit_s:.0f} s")

    def _row(self, arm: str, phase: str, step: Step, measured: bool, outcome: Outcome) -> dict[str, Any]:
        expected_pool = self.scenario.pool(arm)
        return {
            "tenant": step.tenant, "arm": arm, "phase": phase, "rep": step.rep, "role": step.role,
            "warmup": not measured, "prompt_len": len(step.prompt), **asdict(outcome),
            "misrouted": outcome.pool is not None and outcome.pool != expected_pool, "upstream_delta": None,
        }

    async def _sample(self, label: str, phase: str | None, rep: int | None) -> None:
        audit = await self.observer.admin("/admin/audit")
        ledger: dict[str, dict[str, dict[str, int]]] = {}
        for tenant, media in (audit or {}).get("tenants", {}).items():
            ledger[tenant] = {medium: {"resident": stats.get("resident", 0), "stored": stats.get("stored", 0)}
                              for medium, stats in media.items() if isinstance(stats, dict)}
        self.raw.timeline.append({"t": time.time(), "label": label, "phase": phase, "rep": rep,
                                  "ledger": ledger, "memory": self.observer.memory()})

    def _phase_line(self, phase: str, rep: int) -> str:
        parts = []
        for arm in ARMS:
            rows = [r for r in self.raw.requests if r["phase"] == phase and r["arm"] == arm and r["ttft_s"] is not None
                    and r["role"] != "probe" and (phase == "restart" or r["rep"] == rep)]
            if rows:
                ttfts = sorted(r["ttft_s"] for r in rows)
                cached = sum(r["cached_tokens"] or 0 for r in rows) / len(rows)
                parts.append(f"{arm} TTFT p50 {ttfts[len(ttfts) // 2] * 1000:.0f} ms, cached {cached:.0f}")
        kind = "warm-up " if rep < 0 else ""
        return f"{kind}rep {rep} {phase}: " + "; ".join(parts)

    # -- the gateway's own cost ------------------------------------------------------------------------

    async def _overhead_pairs(self) -> None:
        """Fresh prompts to the control upstream, directly and through the gateway, alternating which goes
        first; both are cold, so the paired difference is what the gateway adds end to end."""
        upstream = self.targets.upstreams["control"]
        if upstream.url is None:
            self.progress.note("direct-vs-gateway baseline skipped: no --upstream URL for the control arm")
            return
        tenant = self.scenario.tenant_names[0]
        access = self.targets.access.tenants[tenant]
        for index in range(self.scenario.overhead_pairs):
            routes = ["direct", "gateway"] if index % 2 == 0 else ["gateway", "direct"]
            for route in routes:
                prompt = self.book.overhead(index, route)
                via_gateway = route == "gateway"
                ask = Ask(access.key if via_gateway else upstream.api_key, access.users["control"], prompt,
                          self.scenario.model, self.scenario.max_tokens)
                base = self.targets.gateway_url if via_gateway else upstream.url
                outcome = await self._request(base, ask)
                row = self._row("control", "overhead", Step(tenant, route, index, prompt), True, outcome)
                row["misrouted"] = via_gateway and row["misrouted"]
                self.raw.requests.append(row)
                self.progress.step(f"overhead pair {index} {route}")
        self.progress.note(f"direct-vs-gateway baseline: {self.scenario.overhead_pairs} pairs")

    # -- restart -------------------------------------------------------------------------------------

    async def _restart_phase(self) -> None:
        hooked = [arm for arm in ARMS if self.targets.upstreams[arm].restart_hook is not None]
        if not hooked:
            self.progress.note("restart skipped: no upstream has a restart hook (--restart-cmd ARM=CMD)")
            self.raw.ledger_restart = {"skipped": "no restart hook"}
            return
        limit_s = self.scenario.timeouts.ledger_s
        audit_before = await self.observer.settled_audit(limit_s)
        await self._sample("before restart", "restart", None)
        self.progress.note(f"restarting {', '.join(hooked)} ...")
        self.raw.restarts = list(await asyncio.gather(*(self._restart_one(arm) for arm in hooked)))
        for result in self.raw.restarts:
            self.progress.step(f"{result['arm']} restarted")
            self.progress.note(f"{result['arm']} restarted in {result['seconds']:.1f} s"
                               + ("" if result["ok"] else f" (failed: {result['error']})"))
        pools = [self.scenario.pool(arm) for arm in hooked]
        for arm in ARMS:  # warms each fresh server, and its first KV event tells the ledger of the restart
            probe = Step(self.scenario.tenant_names[0], "probe", -1, self.book.probe(f"restart-{arm}"))
            await self._send(arm, "restart", probe, measured=False, per_request=False)
        seen = await self._await_ledger_restart(audit_before, pools)
        await self._sample("after restart", "restart", None)
        await self._phase("restart", 0, self.restart_steps(), self.arm_order(0))
        seen = seen or await self._await_ledger_restart(audit_before, pools)
        audit_after = await self.observer.settled_audit(limit_s)
        self.raw.ledger_restart = {"pools": pools, "observed": seen, "before": audit_before, "after": audit_after}

    async def _restart_one(self, arm: str) -> dict[str, Any]:
        upstream = self.targets.upstreams[arm]
        assert upstream.restart_hook is not None
        limit_s = self.scenario.timeouts.restart_s
        pid_before = upstream.pid()
        started = time.monotonic()
        error = None
        try:
            await asyncio.to_thread(upstream.restart_hook.restart, limit_s)
            if upstream.url is not None:
                await asyncio.to_thread(wait_healthy, upstream.url, limit_s)
        except (RuntimeError, TimeoutError, OSError, subprocess.TimeoutExpired) as failure:
            error = f"{type(failure).__name__}: {failure}"
        return {"arm": arm, "ok": error is None, "error": error, "seconds": time.monotonic() - started,
                "pid_before": pid_before, "pid_after": upstream.pid(), "finished_at": time.time()}

    async def _await_ledger_restart(self, before: dict[str, Any] | None, pools: list[str]) -> bool:
        """Poll the audit until each restarted pool's sources report a restart or loss they had not before."""
        deadline = time.monotonic() + self.scenario.timeouts.ledger_s
        while time.monotonic() < deadline:
            audit = await self.observer.admin("/admin/audit")
            if audit is not None and all(source_ends(audit, pool) > source_ends(before, pool) for pool in pools):
                return True
            await asyncio.sleep(0.25)  # polling interval of a condition, not synchronisation
        return False


def source_ends(audit: dict[str, Any] | None, pool: str) -> int:
    """Restarts plus losses the audit reports for a pool's event sources (named `<pool>/<index>`)."""
    gaps = (audit or {}).get("gaps", [])
    return sum(int(g.get("restarts", 0)) + int(g.get("lost", 0)) for g in gaps
               if str(g.get("source", "")).startswith(f"{pool}/"))
