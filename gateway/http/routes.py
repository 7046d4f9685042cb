"""The closed set of paths the gateway serves, with their methods and required scope."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from gateway.policy.model import Scope


class Kind(Enum):
    GENERATE = "generate"  # body rewritten: cache_salt, kv_transfer_params, stream options
    EMBED = "embed"  # body rewritten: cache_salt only
    FORWARD = "forward"  # body or query forwarded unchanged
    METRICS = "metrics"
    ADMIN = "admin"
    HEALTH = "health"


@dataclass(frozen=True)
class RouteSpec:
    path: str
    methods: frozenset[str]
    scope: Scope | None  # None: any valid key
    kind: Kind


def _route(path: str, methods: str, scope: Scope | None, kind: Kind) -> tuple[str, RouteSpec]:
    return path, RouteSpec(path, frozenset(methods.split()), scope, kind)


ROUTES: dict[str, RouteSpec] = dict(
    [
        _route("/v1/completions", "POST", "inference", Kind.GENERATE),
        _route("/v1/chat/completions", "POST", "inference", Kind.GENERATE),
        _route("/v1/responses", "POST", "inference", Kind.GENERATE),
        _route("/v1/embeddings", "POST", "inference", Kind.EMBED),
        _route("/v1/models", "GET", "inference", Kind.FORWARD),
        _route("/tokenize", "POST", "inference", Kind.FORWARD),
        _route("/detokenize", "POST", "inference", Kind.FORWARD),
        _route("/metrics", "GET", "metrics", Kind.METRICS),
        _route("/admin/policies", "GET", "admin", Kind.ADMIN),
        _route("/admin/reload", "POST", "admin", Kind.ADMIN),
        _route("/admin/audit", "GET", "admin", Kind.ADMIN),
        _route("/admin/shadow", "GET", "admin", Kind.ADMIN),
        _route("/livez", "GET HEAD", None, Kind.HEALTH),
        _route("/readyz", "GET HEAD", None, Kind.HEALTH),
    ]
)

FORWARDED_KINDS = frozenset({Kind.GENERATE, Kind.EMBED, Kind.FORWARD})
