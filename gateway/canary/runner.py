"""Runs canary probes against a pool's upstreams: on demand (admin route, `kvgate canary`) and on the pool's
`canary.interval_s` schedule (a loop owned by the gateway's TaskSupervisor).

Probes go straight to the pool's upstreams with the pool's own key, never through a tenant's path, and only
under the canary identities. Results count in `kvgate_isolation_canary_total{pool,result}`; the latest per
upstream is kept (bounded by the number of upstreams) for `/admin/audit`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import msgspec
from prometheus_client import CollectorRegistry, Counter

from gateway.canary.probe import (
    IDENTITY_A,
    IDENTITY_B,
    RESULTS,
    Outcome,
    Probe,
    Result,
    external_hits,
    judge,
    random_prefix,
)
from gateway.errors import GatewayError
from gateway.log import get_logger
from gateway.policy.loader import PolicySet
from gateway.proxy.smallcalls import SmallCalls, client_error, read_small

log = get_logger(__name__)
SCHEDULE_TICK_S = 5.0  # how often the schedule loop looks for a pool whose interval has passed
# Anything an upstream can answer wrongly (unreachable, an error status, a body of another shape) is an `error`
# outcome, never an exception that would end the schedule loop; with these, the HTTP client's errors.
PROBE_ERRORS = (TimeoutError, GatewayError, ValueError, KeyError, TypeError, IndexError, AttributeError)


class CanaryRunner:
    def __init__(self, calls: SmallCalls, secret: bytes, registry: CollectorRegistry,
                 clock: Callable[[], float] = time.time, tick_s: float = SCHEDULE_TICK_S) -> None:
        self.calls = calls
        self.secret = secret
        self.clock = clock
        self.tick_s = tick_s
        self.runs = Counter("kvgate_isolation_canary", "Isolation canary probes by pool and result.",
                            ["pool", "result"], registry=registry)
        self.latest: dict[tuple[str, str], Outcome] = {}
        self._lock = asyncio.Lock()  # one probe at a time: probes must not see each other's hits

    def prime(self, policies: PolicySet) -> None:
        for pool in policies.gateway.pools:
            for result in RESULTS:
                self.runs.labels(pool, str(result))

    async def run_pool(self, policies: PolicySet, pool_name: str) -> list[Outcome]:
        outcomes = []
        async with self._lock:
            for upstream in policies.gateway.pools[pool_name].upstreams:
                outcome = await self._probe_upstream(policies, pool_name, upstream)
                self.runs.labels(pool_name, str(outcome.result)).inc()
                self.latest[(pool_name, upstream)] = outcome
                log.info("isolation_canary", pool=pool_name, upstream=upstream, result=str(outcome.result),
                         cached_b=outcome.cached_b)
                outcomes.append(outcome)
        return outcomes

    def summary(self, policies: PolicySet) -> dict[str, Any]:
        pools = policies.gateway.pools
        return {name: {"connector": pool.connector, "interval_s": pool.canary.interval_s,
                       "latest": [self.latest[(name, up)].view() for up in pool.upstreams
                                  if (name, up) in self.latest]}
                for name, pool in pools.items()}

    async def schedule(self, current: Callable[[], PolicySet]) -> None:
        """Probe each pool whose interval has passed; runs until cancelled."""
        last_run: dict[str, float] = {}
        while True:
            policies = current()
            for name, pool in policies.gateway.pools.items():
                interval = pool.canary.interval_s
                if interval is not None and self.clock() - last_run.get(name, 0.0) >= interval:
                    last_run[name] = self.clock()
                    await self.run_pool(policies, name)
            await asyncio.sleep(self.tick_s)

    async def _probe_upstream(self, policies: PolicySet, pool_name: str, upstream: str) -> Outcome:
        try:
            return await self._probe(policies, pool_name, upstream)
        except (*PROBE_ERRORS, client_error()) as error:
            detail = f"{type(error).__name__}: {error}"[:300]
            return Outcome(pool_name, upstream, Result.ERROR, detail=detail, at=self.clock())

    async def _probe(self, policies: PolicySet, pool_name: str, upstream: str) -> Outcome:
        pool = policies.gateway.pools[pool_name]
        headers = {"content-type": "application/json", **policies.pool_auth(pool_name)}
        model = pool.canary.model or await self._model(upstream, headers)
        probe = Probe(random_prefix(pool.canary.prefix_tokens), model)
        cached_a = await self._complete(upstream, headers, probe.body(IDENTITY_A, self.secret, pool))
        await asyncio.sleep(pool.canary.settle_s)
        before = await self._external_hits(upstream, headers)
        cached_b = await self._complete(upstream, headers, probe.body(IDENTITY_B, self.secret, pool))
        after = await self._external_hits(upstream, headers)
        delta = None if before is None or after is None else after - before
        return Outcome(pool_name, upstream, judge(cached_b, delta), cached_a, cached_b, delta, at=self.clock())

    async def _model(self, upstream: str, headers: dict[str, str]) -> str:
        session = await self.calls.session()
        async with session.get(f"{upstream}/v1/models", headers=headers) as response:
            response.raise_for_status()
            model: str = msgspec.json.decode(await read_small(response))["data"][0]["id"]
            return model

    async def _complete(self, upstream: str, headers: dict[str, str], body: dict[str, Any]) -> int:
        data = msgspec.json.encode(body)
        session = await self.calls.session()
        async with session.post(f"{upstream}/v1/completions", headers=headers, data=data) as response:
            response.raise_for_status()
            reply = msgspec.json.decode(await read_small(response))
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")
        if type(cached) is not int:  # unknown is an error, never read as 0 (and never as a pass)
            raise ValueError("no usage.prompt_tokens_details.cached_tokens: start vLLM with "
                             "--enable-prompt-tokens-details")
        return cached

    async def _external_hits(self, upstream: str, headers: dict[str, str]) -> float | None:
        session = await self.calls.session()
        try:
            async with session.get(f"{upstream}/metrics", headers=headers) as response:
                if response.status != 200:
                    return None
                return external_hits((await read_small(response)).decode("utf-8", "replace"))
        except client_error():
            return None
