"""Mirror sampled requests to the shadow pool without touching the primary, then compare the pair.

The shadow call is an owned background task: it never delays, changes or fails the primary. Each
tenant has at most `max_in_flight` shadows; the rest are dropped and counted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from gateway.errors import ServiceUnavailable
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import PolicySet
from gateway.policy.model import TenantPolicy
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.rollout import draw_percent
from gateway.proxy.sse import stream_usage, usage_from_json
from gateway.shadow.client import ShadowAnswer, ShadowClient
from gateway.shadow.compare import ArmResult, generated_text, pair_record
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.stats import tenant_summary
from gateway.storage import errors_with_redis
from gateway.tasks import TaskSupervisor

log = get_logger(__name__)


class ShadowStoreUnavailable(ServiceUnavailable):
    pass


class PrimarySlot:
    """Where the primary leaves its result for the shadow task to pick up."""

    def __init__(self) -> None:
        self.result: ArmResult | None = None
        self._done = asyncio.Event()

    def set(self, result: ArmResult | None) -> None:
        self.result = result
        self._done.set()

    async def wait(self) -> ArmResult | None:
        await self._done.wait()
        return self.result


@dataclass(frozen=True)
class ShadowCall:
    """The mirrored request: the primary's rewritten body (same salt, same caps), its own request id."""

    tenant: str
    primary_pool: str
    path: str
    request_id: str
    headers: dict[str, str]
    body: bytes
    streamed: bool
    deterministic: bool
    affinity: str
    shadow_pool: str = ""
    upstream: str = ""  # the shadow pool's upstream URL that `path` is sent under

    @property
    def pools(self) -> tuple[str, str]:
        return self.primary_pool, self.shadow_pool


class ShadowRunner:
    def __init__(self, client: ShadowClient, metrics: GatewayMetrics, recorder: ShadowRecorder,
                 tasks: TaskSupervisor, health: UpstreamHealth, timeout_s: float) -> None:
        self.client = client
        self.health = health
        self.metrics = metrics
        self.recorder = recorder
        self.tasks = tasks
        self.timeout_s = timeout_s
        self._in_flight: dict[str, int] = {}

    def sampled(self, tenant: TenantPolicy, request_id: str, primary_pool: str) -> bool:
        shadow = tenant.shadow
        if shadow.pool is None or shadow.pool == primary_pool or shadow.sample <= 0:
            return False
        return draw_percent(f"shadow:{request_id}") < shadow.sample * 100

    def mirror(self, policies: PolicySet, tenant: TenantPolicy, call: ShadowCall) -> PrimarySlot | None:
        """Start the shadow of a sampled request; None when the tenant's shadows are all in flight."""
        if self._in_flight.get(tenant.tenant, 0) >= tenant.shadow.max_in_flight:
            self._count(tenant.tenant, "dropped")
            return None
        shadow_pool = tenant.shadow.pool or ""
        pool = policies.gateway.pools[shadow_pool]
        upstream = self.health.candidates(pool.upstreams, call.affinity)[0]
        headers = {name: value for name, value in call.headers.items() if name != "authorization"}
        headers |= policies.pool_auth(shadow_pool)
        shadow_call = dataclasses.replace(call, shadow_pool=shadow_pool, upstream=upstream, headers=headers)
        slot = PrimarySlot()
        self._in_flight[tenant.tenant] = self._in_flight.get(tenant.tenant, 0) + 1
        self.tasks.spawn(self._run(shadow_call, slot), f"shadow-{shadow_call.request_id}")
        return slot

    async def _run(self, call: ShadowCall, slot: PrimarySlot) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                shadow = await self._call(call)
            async with asyncio.timeout(self.timeout_s):
                primary = await slot.wait()
            self._settle(call, primary, shadow)
        except Exception as error:  # a shadow must never take anything down; it is counted and logged
            log.warning("shadow_failed", tenant=call.tenant, request_id=call.request_id, error=type(error).__name__)
            self._count(call.tenant, "error")
        finally:
            self._in_flight[call.tenant] -= 1

    def _settle(self, call: ShadowCall, primary: ArmResult | None, shadow: ArmResult) -> None:
        if primary is None or primary.status != 200 or shadow.status != 200:
            log.warning("shadow_pair_incomplete", tenant=call.tenant, request_id=call.request_id,
                        primary_status=primary.status if primary else None, shadow_status=shadow.status)
            self._count(call.tenant, "error")
            return
        pair = pair_record(call.tenant, call.pools, primary, shadow, call.deterministic, time.time())
        self.recorder.add_pair(pair)  # before the metrics, so a report never lags the counters it explains
        self.metrics.shadow_requests.labels(call.tenant, "compared").inc()
        if pair.ttft_delta_s is not None:
            self.metrics.shadow_ttft_delta.labels(call.tenant).observe(pair.ttft_delta_s)
        if pair.mismatch:
            self.metrics.shadow_mismatches.labels(call.tenant).inc()
            log.warning("shadow_output_mismatch", tenant=call.tenant, primary_request_id=primary.request_id,
                        shadow_request_id=shadow.request_id, pools=list(call.pools))

    def _count(self, tenant: str, outcome: str) -> None:
        self.recorder.count(tenant, outcome)
        self.metrics.shadow_requests.labels(tenant, outcome).inc()

    async def _call(self, call: ShadowCall) -> ArmResult:
        started = time.perf_counter()
        answer = await self.client.post(call.upstream, call.path, call.headers, call.body,
                                        watch_content=call.streamed)
        return arm_result(call, answer, started, time.perf_counter())

    async def close(self) -> None:
        """Cancel shadows still in flight, then write every recorded result and close the store."""
        await self.tasks.close()
        self.client.close()
        await self.recorder.close()

    async def report(self, policies: PolicySet, recent_pairs: int = 0) -> dict[str, Any]:
        """Per-tenant summaries; with `recent_pairs`, also that many latest pairs (request ids, deltas).

        A store that cannot be read is a 503 the caller may retry, not a failure of the gateway.
        """
        try:
            await self.recorder.flush()  # this replica's own results first, so the report is never behind it
            tenants = {name: await self._tenant_report(name, recent_pairs) for name in sorted(policies.tenants)}
        except errors_with_redis(sqlite3.Error) as error:
            raise ShadowStoreUnavailable(
                f"The shadow store cannot be read now ({type(error).__name__}); try again.") from error
        return {"policy_version": policies.version, "tenants": tenants}

    async def _tenant_report(self, tenant: str, recent_pairs: int) -> dict[str, Any]:
        store = self.recorder.store
        pairs, counts = await store.results(tenant)
        summary = tenant_summary(pairs, counts)
        if recent_pairs:
            summary["recent_pairs"] = [dataclasses.asdict(pair) for pair in pairs[:recent_pairs]]
        return summary


def arm_result(call: ShadowCall, answer: ShadowAnswer, started: float, ended: float) -> ArmResult:
    ok = answer.status == 200
    streamed = ok and call.streamed
    usage = (stream_usage(answer.body) if streamed else usage_from_json(answer.body)) if ok else None
    ttft = answer.first_content_at - started if streamed and answer.first_content_at is not None else None
    cached = usage.cached_tokens if usage else None
    text = generated_text(answer.body) if ok else None
    return ArmResult(call.request_id, answer.status, ttft, ended - started, cached, text)
