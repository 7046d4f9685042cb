"""Request body rewriting (docs/http.md): salt, KV-transfer caps, stream options.

Only the fields named here change; every other field of the client's JSON is forwarded as sent, and a long prompt
is forwarded as the very JSON text the client sent (gateway.proxy.rawprompt).
"""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.connectors.lmcache_tags import body_for_pool, lmcache_params
from gateway.errors import BadRequest
from gateway.policy.model import OffloadPolicy, PoolConfig, TenantPolicy
from gateway.proxy.rawprompt import HEAD_BYTES, decode_request, decoded, decoded_head
from gateway.proxy.shape import check_user_value
from gateway.routes import Kind, RouteSpec, StreamStyle
from gateway.salts import Salts
from gateway.strict.request_fields import apply_engine_policy, check_types

CAP_KEYS = ("max_load_tokens", "max_offload_tokens")


class RewrittenRequest(msgspec.Struct, frozen=True):
    # The rewritten body, open to features (gateway.proxy.features) until encoded. A long prompt value is a
    # msgspec.Raw (its JSON text): read it through gateway.proxy.rawprompt.decoded.
    request: dict[str, Any]
    upstream_stream: bool
    client_stream: bool
    strip_usage: bool  # the gateway asked for usage the client did not want
    assemble: bool  # `measure_ttft`: stream upstream, answer the client in one body
    model: str | None
    user: str | None
    deterministic: bool
    affinity: str  # salt and the start of the prompt: requests sharing both can share cached blocks
    dropped_fields: tuple[str, ...] = ()  # engine-steering fields removed by policy (counted in metrics)

    @property
    def body(self) -> bytes:
        """The request as JSON; the proxy encodes once, after every feature has had its turn."""
        return msgspec.json.encode(self.request)


def rewrite_request(
    body: bytes, route: RouteSpec, tenant: TenantPolicy, salts: Salts, header_user: str | None
) -> RewrittenRequest:
    request = decode_request(body)
    check_user_value(request.get("user"), "user")
    kind = route.kind
    check_types(request, route)
    dropped = apply_engine_policy(request, route, tenant.engine_fields)
    user = header_user if header_user is not None else _body_user(request)
    _apply_salt(request, tenant, salts, user)
    if kind is Kind.GENERATE:
        _apply_caps(request, tenant.offload)
    elif "kv_transfer_params" in request:
        raise BadRequest("kv_transfer_params is only accepted on generation routes.", param="kv_transfer_params")
    client_stream = request.get("stream") is True
    # Responses-API streams always end with usage, and vLLM has no stream_options there.
    chunked_api = kind is Kind.GENERATE and route.stream is StreamStyle.CHUNKS
    assemble = chunked_api and tenant.measure_ttft and not client_stream
    strip_usage = chunked_api and (client_stream or assemble) and _request_usage(request)
    return RewrittenRequest(
        request=request,
        upstream_stream=client_stream or assemble,
        client_stream=client_stream,
        strip_usage=strip_usage,
        assemble=assemble,
        model=request.get("model") if isinstance(request.get("model"), str) else None,
        user=user,
        deterministic=_deterministic(request),
        affinity=f"{request.get('cache_salt', tenant.tenant)}:{prompt_prefix(request)}",
        dropped_fields=tuple(dropped),
    )


def encode_for_pool(prepared: RewrittenRequest, route: RouteSpec, tenant: TenantPolicy, secret: bytes,
                    pool: PoolConfig) -> bytes:
    """The rewritten request as it goes to `pool` (the primary's or the shadow's): with the `lmcache.*` entries only
    when that pool runs LMCache, computed from the request as it is sent, after the features."""
    if not pool.lmcache:
        return prepared.body
    return body_for_pool(prepared.request, lmcache_entries(prepared.request, route, tenant, secret), pool)


def lmcache_entries(request: dict[str, Any], route: RouteSpec, tenant: TenantPolicy, secret: bytes) -> dict[str, Any]:
    """The `lmcache.*` entries (the tenant tag, skip_save) for a pool whose connector is LMCache. Taken from the
    request as it is sent, after the features: a store that offload admission refused is `skip_save` too. Only
    requests to such pools pay for the tag's HMAC."""
    if route.kind is not Kind.GENERATE:
        return {}
    sent = request.get("kv_transfer_params")
    return lmcache_params(secret, request.get("cache_salt"), tenant.offload, sent if isinstance(sent, dict) else {})


AFFINITY_CHARS = 256
PREFIX_ITEMS = 8  # the items of a prompt list the prefix reads


def prompt_prefix(request: dict[str, Any]) -> str:
    """The first characters of the prompt, whichever API field carries it."""
    for field in ("prompt", "messages", "input"):
        if field in request:
            value = request[field]
            text = _raw_text(value) if isinstance(value, msgspec.Raw) else _text_of(value)
            return text[:AFFINITY_CHARS]
    return ""


def _raw_text(raw: msgspec.Raw) -> str:
    """The start of a prompt kept as JSON text: from its first KiB, or its first few, when they hold
    AFFINITY_CHARS characters of text, else from the whole value."""
    for size in HEAD_BYTES:
        head = decoded_head(raw, size)
        if head is None:
            continue
        text = _text_of(head)
        # Only the head's last value may be cut short, and its text is the start of the real one: the prefix is
        # exact once it is long enough, or when that value lies past the list items the prefix reads.
        if len(text) >= AFFINITY_CHARS or (isinstance(head, list) and len(head) > PREFIX_ITEMS):
            return text
    try:
        return _text_of(decoded(raw))
    except msgspec.DecodeError:  # a number out of float range: the engine refuses the request
        return ""


def _text_of(value: object) -> str:
    """The start of a prompt value's text: at least AFFINITY_CHARS characters where it has them (a long prompt is
    never copied whole: with a 128k-token message that copy was a second prompt in memory)."""
    if isinstance(value, str):
        return value[:AFFINITY_CHARS]
    if isinstance(value, list):
        pieces: list[str] = []
        length = 0
        for item in value[:PREFIX_ITEMS]:
            piece = _text_of(item)
            pieces.append(piece)
            length += len(piece)
            if length >= AFFINITY_CHARS:
                break
        return "".join(pieces)
    if isinstance(value, dict):
        return _text_of(value.get("content", ""))
    return str(value)[:AFFINITY_CHARS]


def _body_user(request: dict[str, Any]) -> str | None:
    user = request.get("user")
    return user if isinstance(user, str) and user else None


def _apply_salt(request: dict[str, Any], tenant: TenantPolicy, salts: Salts, user: str | None) -> None:
    if "cache_salt" in request and tenant.cache.client_salt == "reject":
        raise BadRequest("cache_salt is set by the gateway; this tenant may not send one.", param="cache_salt")
    request.pop("cache_salt", None)
    isolation = tenant.cache.isolation
    if isolation == "none":
        return
    if isolation == "user" and user is None:
        raise BadRequest("This tenant's cache is isolated per user: send the `user` field.", param="user")
    per_user = user if isolation == "user" else None
    request["cache_salt"] = salts.derive(tenant.tenant, tenant.cache.salt_epoch, per_user)


def _apply_caps(request: dict[str, Any], offload: OffloadPolicy) -> None:
    params = _client_transfer_params(request.get("kv_transfer_params"))
    for key in CAP_KEYS:
        capped = _capped(params.get(key), getattr(offload, key))
        params.pop(key, None)
        if capped is not None:
            params[key] = capped
    if params:
        request["kv_transfer_params"] = params
    else:
        request.pop("kv_transfer_params", None)


def _client_transfer_params(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest("kv_transfer_params must be an object.", param="kv_transfer_params")
    for key, cap in value.items():
        if key not in CAP_KEYS:
            raise BadRequest(f"kv_transfer_params.{key} is not allowed.", param=f"kv_transfer_params.{key}")
        if cap is not None and (type(cap) is not int or cap < 0):
            raise BadRequest(f"kv_transfer_params.{key} must be a non-negative integer.",
                             param=f"kv_transfer_params.{key}")
    return dict(value)


def _capped(client: int | None, cap: int | None) -> int | None:
    if client is None:
        return cap
    return client if cap is None else min(client, cap)


def _request_usage(request: dict[str, Any]) -> bool:
    """Make sure upstream reports usage; True when the client did not ask for it itself."""
    options = request.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    merged = dict(options) if isinstance(options, dict) else {}
    merged["include_usage"] = True
    request["stream_options"] = merged
    request["stream"] = True
    return True


def _deterministic(request: dict[str, Any]) -> bool:
    temperature = request.get("temperature")
    return temperature == 0 or isinstance(request.get("seed"), int)
