"""Features that hook into a forwarded request, in one explicit, ordered list built by the composition root.

A request passes these points, and each feature may act at any of them:

0. `prepare` (async, optional) — at the same point as `start`, before it, for a feature that must wait on I/O to
   decide (offload admission asks Redis). Only features that override it are awaited.
1. `start` — after the body is rewritten and the pool chosen, before the body is encoded: a feature may edit the
   parsed request (offload admission, connector tags) or note what it needs (the ledger's per-user salts, the
   reuse trace's fingerprints). It may return a `Finish` to be called with the finished exchange.
2. `sent` — with the encoded outbound request, just before the primary is sent (shadow mirroring).
3. `finished` — for every request the gateway answered, refused ones included (GenAI metrics).

Features never raise into the request path for their own failures: a feature that can fail catches, counts and
logs its own errors. Adding a feature is one entry in `gateway.http.app.GatewayApp._features`, not an edit here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from gateway.asgi.io import Receive, Scope, Send
from gateway.policy.loader import PolicySet
from gateway.policy.model import PoolConfig, TenantPolicy
from gateway.proxy.record import Exchange
from gateway.proxy.rewrite import RewrittenRequest
from gateway.routes import RouteSpec

Finish = Callable[[Exchange], None]

# The per-request records here (and RewrittenRequest, Relaying, the reuse trace's PromptParts, FinishedRequest and
# Job) are frozen msgspec Structs, not frozen dataclasses: a frozen dataclass's __init__ sets each field through
# object.__setattr__ (1.3 µs for 12 fields), a Struct is built in C (0.11 µs); a request builds about ten of them.

class Inbound(msgspec.Struct, frozen=True):
    """The ASGI triple of one client request."""

    scope: Scope
    receive: Receive
    send: Send
    # The server's own send, past the app's response tracker: for body messages once the response has started
    # through `send` (the tracker only needs the start), on the relay's per-event path.
    server_send: Send


class Admitted(msgspec.Struct, frozen=True):
    """An authenticated request for a forwarded route: whose, and under which policy set."""

    policies: PolicySet
    tenant: TenantPolicy
    route: RouteSpec
    # The same request admitted again under the set in force now; called once its body has arrived, so a set
    # that came into force meanwhile (a raised salt epoch, a revoked key) governs what goes upstream.
    readmit: Readmit | None = None


Readmit = Callable[[Admitted], Admitted]


class Call(msgspec.Struct, frozen=True):
    """One forwarded request's context: who, which route, which pool, and the rewritten request."""

    request_id: str
    policies: PolicySet
    tenant: TenantPolicy
    route: RouteSpec
    pool_name: str
    pool: PoolConfig
    prepared: RewrittenRequest | None  # None for routes forwarded unchanged

    @property
    def user(self) -> str | None:
        return self.prepared.user if self.prepared is not None else None


class Outbound(msgspec.Struct, frozen=True):
    """One prepared upstream request."""

    method: str
    candidates: list[str]  # upstreams of the pool, best first
    target: str  # path and query
    headers: dict[str, str]
    body: bytes | None


class RequestFeature:
    """Base class: every hook does nothing unless a feature overrides it."""

    name = "feature"

    async def prepare(self, call: Call, request: dict[str, Any]) -> Finish | None:
        return None

    def start(self, call: Call, request: dict[str, Any]) -> Finish | None:
        return None

    def sent(self, call: Call, outbound: Outbound, ex: Exchange) -> Finish | None:
        return None

    def finished(self, ex: Exchange) -> None:
        return None


class Features:
    """The ordered feature list, and the calls that run it."""

    def __init__(self, features: list[RequestFeature]) -> None:
        self.all = tuple(features)
        # Per hook, only the features that override it, in list order: a request does not call the no-ops.
        self.preparing = tuple(f for f in features if type(f).prepare is not RequestFeature.prepare)
        self.starting = tuple(f for f in features if type(f).start is not RequestFeature.start)
        self.sending = tuple(f for f in features if type(f).sent is not RequestFeature.sent)
        self.finishing = tuple(f for f in features if type(f).finished is not RequestFeature.finished)

    async def prepare(self, call: Call, request: dict[str, Any]) -> list[Finish]:
        finishes: list[Finish] = []
        for feature in self.preparing:
            finish = await feature.prepare(call, request)
            if finish is not None:
                finishes.append(finish)
        return finishes

    def start(self, call: Call, request: dict[str, Any]) -> list[Finish]:
        return [finish for feature in self.starting if (finish := feature.start(call, request)) is not None]

    def sent(self, call: Call, outbound: Outbound, ex: Exchange) -> list[Finish]:
        return [finish for feature in self.sending if (finish := feature.sent(call, outbound, ex)) is not None]

    def finished(self, ex: Exchange) -> None:
        for feature in self.finishing:
            feature.finished(ex)
