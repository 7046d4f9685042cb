"""The closed set of paths the gateway serves: methods, required scope, and every per-route behaviour.

A new route is one row here; nothing else in the gateway compares path strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypedDict, Unpack

from gateway.policy.model import Scope


class Kind(Enum):
    GENERATE = "generate"  # body rewritten: cache_salt, kv_transfer_params, stream options
    EMBED = "embed"  # body rewritten: cache_salt only
    FORWARD = "forward"  # body or query forwarded unchanged
    METRICS = "metrics"
    ADMIN = "admin"
    HEALTH = "health"


class StreamStyle(Enum):
    """How the route streams: SSE chunks ending in `data: [DONE]`, or the Responses API's typed events."""

    CHUNKS = "chunks"  # completions and chat: `stream_options.include_usage` asks for a usage chunk
    RESPONSES = "responses"  # usage always arrives in `response.completed`; vLLM has no stream_options there


class Local(Enum):
    """Endpoints the gateway answers itself."""

    METRICS = "metrics"
    LIVEZ = "livez"
    READYZ = "readyz"
    POLICIES = "policies"
    RELOAD = "reload"
    AUDIT = "audit"
    SHADOW = "shadow"
    CANARY = "canary"
    PLAN = "plan"


@dataclass(frozen=True)
class RouteSpec:
    path: str
    methods: frozenset[str]
    scope: Scope | None  # None: any valid key
    kind: Kind
    stream: StreamStyle | None = None  # generation routes only
    chat: bool = False  # replies carry `choices[].delta.content` (chat) rather than `choices[].text`
    genai_operation: str | None = None  # the OTel GenAI operation name, for GenAI operations
    local: Local | None = None  # endpoints the gateway answers itself


class RouteOptions(TypedDict, total=False):
    """The optional fields of a `RouteSpec`, by name."""

    stream: StreamStyle | None
    chat: bool
    genai_operation: str | None
    local: Local | None


def _route(
    path: str, methods: str, scope: Scope | None, kind: Kind, **options: Unpack[RouteOptions],
) -> tuple[str, RouteSpec]:
    return path, RouteSpec(path, frozenset(methods.split()), scope, kind, **options)


ROUTES: dict[str, RouteSpec] = dict(
    [
        _route("/v1/completions", "POST", "inference", Kind.GENERATE, stream=StreamStyle.CHUNKS,
               genai_operation="text_completion"),
        _route("/v1/chat/completions", "POST", "inference", Kind.GENERATE, stream=StreamStyle.CHUNKS, chat=True,
               genai_operation="chat"),
        _route("/v1/responses", "POST", "inference", Kind.GENERATE, stream=StreamStyle.RESPONSES,
               genai_operation="chat"),
        _route("/v1/embeddings", "POST", "inference", Kind.EMBED, genai_operation="embeddings"),
        _route("/v1/models", "GET", "inference", Kind.FORWARD),
        _route("/tokenize", "POST", "inference", Kind.FORWARD),
        _route("/detokenize", "POST", "inference", Kind.FORWARD),
        _route("/metrics", "GET", "metrics", Kind.METRICS, local=Local.METRICS),
        _route("/admin/policies", "GET", "admin", Kind.ADMIN, local=Local.POLICIES),
        _route("/admin/reload", "POST", "admin", Kind.ADMIN, local=Local.RELOAD),
        _route("/admin/audit", "GET", "admin", Kind.ADMIN, local=Local.AUDIT),
        _route("/admin/shadow", "GET", "admin", Kind.ADMIN, local=Local.SHADOW),
        _route("/admin/canary", "POST", "admin", Kind.ADMIN, local=Local.CANARY),
        _route("/admin/plan", "GET", "admin", Kind.ADMIN, local=Local.PLAN),
        _route("/livez", "GET HEAD", None, Kind.HEALTH, local=Local.LIVEZ),
        _route("/readyz", "GET HEAD", None, Kind.HEALTH, local=Local.READYZ),
    ]
)

FORWARDED_KINDS = frozenset({Kind.GENERATE, Kind.EMBED, Kind.FORWARD})
