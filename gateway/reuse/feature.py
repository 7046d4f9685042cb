"""Offload admission as a request feature: a `returning` tenant's request whose prefix has not returned often
enough stores nothing in the offload tier (`kv_transfer_params.max_offload_tokens: 0`)."""

from __future__ import annotations

from typing import Any

from gateway.metrics import ChildCache, GatewayMetrics
from gateway.policy.model import AdmissionPolicy
from gateway.proxy.features import Call, Finish, RequestFeature
from gateway.proxy.record import Exchange
from gateway.reuse.admission import AdmissionRule, request_span
from gateway.reuse.shared import Admission, rule_of
from gateway.routes import Kind


def refuse_offload(request: dict[str, Any]) -> None:
    """Store nothing of this request in the offload tier (the client's and the policy's caps were already applied)."""
    params = request.get("kv_transfer_params")
    request["kv_transfer_params"] = {**(params if isinstance(params, dict) else {}), "max_offload_tokens": 0}


class AdmissionFeature(RequestFeature):
    name = "offload-admission"

    def __init__(self, admission: Admission, metrics: GatewayMetrics) -> None:
        self.admission = admission
        self.metrics = metrics
        self._decisions = ChildCache(metrics.offload_admission)
        # Per tenant, the rule of the policy object it was made from: a reload brings new policy objects, so a
        # changed rule is made again; one entry per tenant name ever configured (as Admission's sketches).
        self._rules: dict[str, tuple[AdmissionPolicy, AdmissionRule]] = {}

    async def prepare(self, call: Call, request: dict[str, Any]) -> Finish | None:
        policy = call.tenant.offload.admission
        if policy.mode != "returning" or call.route.kind is not Kind.GENERATE:
            return None
        tenant = call.tenant.tenant
        rule = self._rule(tenant, policy)
        key = self.admission.key_for(tenant, request_span(request, rule.prefix_chunks), rule.prefix_chunks)
        result, store_failed = await self.admission.admit(tenant, key, rule)
        if store_failed:
            self.metrics.offload_admission_errors.labels(tenant).inc()
        if not result.admitted:
            refuse_offload(request)
        return self._noting(tenant, result.decision)

    def _rule(self, tenant: str, policy: AdmissionPolicy) -> AdmissionRule:
        known = self._rules.get(tenant)
        if known is not None and known[0] is policy:
            return known[1]
        rule = rule_of(policy)
        self._rules[tenant] = (policy, rule)
        return rule

    def _noting(self, tenant: str, decision: str) -> Finish:
        # Counted when the request ends, with its log line: nothing the upstream send does not need runs before it.
        def finish(ex: Exchange) -> None:
            ex.admission = decision
            self._decisions.get(tenant, decision).inc()

        return finish
