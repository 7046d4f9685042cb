"""The reuse trace's request feature: at the start of a generation request it takes references to the prompt;
when the request has ended (reply sent, usage known) it hands them to the trace."""

from __future__ import annotations

from typing import Any

from gateway.log import get_logger
from gateway.outcomes import Outcome
from gateway.proxy.features import Call, Finish, RequestFeature
from gateway.proxy.record import Exchange
from gateway.reuse.fingerprint import trace_parts
from gateway.reuse.trace import FinishedRequest, ReuseTrace, TransferCaps
from gateway.routes import Kind

log = get_logger(__name__)


class ReuseTraceFeature(RequestFeature):
    name = "reuse-trace"

    def __init__(self, trace: ReuseTrace) -> None:
        self.trace = trace

    def start(self, call: Call, request: dict[str, Any]) -> Finish | None:
        if call.route.kind is not Kind.GENERATE:
            return None
        # A reference only: the prompt (a long one is still JSON text) and the caps are read once the reply has been
        # sent. Nothing edits the request after this point (features that do run before this one; the body is
        # encoded from it as it stands), and nothing the upstream send does not need runs before it.
        return lambda ex: self._finish(call, request, ex)

    def _finish(self, call: Call, request: dict[str, Any], ex: Exchange) -> None:
        if ex.status != 200 or ex.outcome is not Outcome.OK:
            return  # not a completed cache lookup: nothing to learn from
        tenant = call.tenant
        user = call.user if tenant.cache.isolation == "user" else None  # users whose blocks are never shared
        try:
            parts = trace_parts(request, self.trace.settings.block_tokens)
            self.trace.observe(FinishedRequest(tenant.tenant, tenant.cache.salt_epoch, call.pool_name, parts, ex.usage,
                                               user, transfer_caps(request)))
        except Exception as error:  # the reply is already sent: a body the renderer cannot walk, or a trace bug,
            self._failed(call, error)  # is counted and must not touch the request's outcome

    def _failed(self, call: Call, error: Exception) -> None:
        self.trace.metrics.count(call.tenant.tenant, "error")
        log.warning("reuse_trace_failed", request_id=call.request_id, error=type(error).__name__)


def transfer_caps(request: dict[str, Any]) -> TransferCaps:
    """The offload caps the upstream will see: the rewritten request's, after policy caps and offload admission
    (features that edit the request run before this one)."""
    params = request.get("kv_transfer_params")
    if not isinstance(params, dict):
        return None, None
    return _cap(params.get("max_offload_tokens")), _cap(params.get("max_load_tokens"))


def _cap(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None
