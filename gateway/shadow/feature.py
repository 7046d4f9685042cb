"""Shadow mirroring as a request feature: sampled generation requests are mirrored with the primary's exact
outbound body, and the primary's own result is handed to the shadow task when the primary finishes."""

from __future__ import annotations

import time

from gateway.outcomes import Outcome
from gateway.proxy.features import Call, Finish, Outbound, RequestFeature
from gateway.proxy.record import Exchange
from gateway.proxy.rewrite import encode_for_pool
from gateway.routes import Kind
from gateway.shadow.compare import ArmResult, generated_text
from gateway.shadow.runner import PrimarySlot, ShadowCall, ShadowRunner


class ShadowFeature(RequestFeature):
    name = "shadow"

    def __init__(self, runner: ShadowRunner, salt_secret: bytes) -> None:
        self.runner = runner
        self.salt_secret = salt_secret  # for the LMCache tag of a shadow pool that runs LMCache

    def sent(self, call: Call, outbound: Outbound, ex: Exchange) -> Finish | None:
        prepared = call.prepared
        if prepared is None or outbound.body is None or call.route.kind is not Kind.GENERATE:
            return None
        if not self.runner.sampled(call.tenant, ex.request_id, ex.pool):
            return None
        shadow_id = f"{ex.request_id}-shadow"
        body = outbound.body
        shadow_pool = call.policies.gateway.pools.get(call.tenant.shadow.pool or "")
        if shadow_pool is not None and (shadow_pool.lmcache or call.pool.lmcache):
            # The tag only where LMCache runs (the primary's body may carry it for its own pool).
            body = encode_for_pool(prepared, call.route, call.tenant, self.salt_secret, shadow_pool)
        mirrored = ShadowCall(tenant=call.tenant.tenant, primary_pool=ex.pool, path=call.route.path,
                              request_id=shadow_id, headers={**outbound.headers, "x-request-id": shadow_id},
                              body=body, streamed=prepared.upstream_stream,
                              deterministic=prepared.deterministic, affinity=prepared.affinity)
        slot = self.runner.mirror(call.policies, call.tenant, mirrored)
        if slot is None:
            return None
        ex.capture = bytearray()
        return _handing_over(slot)


def _handing_over(slot: PrimarySlot) -> Finish:
    def finish(ex: Exchange) -> None:
        slot.set(primary_result(ex))

    return finish


def primary_result(ex: Exchange) -> ArmResult | None:
    """The primary arm of a shadow pair, timed from its upstream send like the shadow arm."""
    if ex.capture is None or ex.sent_at == 0.0 or ex.outcome != Outcome.OK:
        return None
    ttft = None if ex.ttft_s is None else ex.ttft_s - (ex.sent_at - ex.started)
    cached = ex.usage.cached_tokens if ex.usage is not None else None
    duration = time.perf_counter() - ex.sent_at
    return ArmResult(ex.request_id, ex.status, ttft, duration, cached, generated_text(bytes(ex.capture)))
