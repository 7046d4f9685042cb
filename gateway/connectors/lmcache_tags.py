"""The per-tenant LMCache tag (docs/lmcache.md). Pure.

LMCache keys its entries by the prompt's tokens plus the `lmcache.tag.*` entries of the request's
`kv_transfer_params` (its vLLM adapter copies every `lmcache.`-prefixed key into the request's configs, and its
cache-engine key folds the `lmcache.tag.` ones into its tags). Some LMCache and vLLM versions leave `cache_salt`
out of that identity, so the gateway carries the tenant itself: a tag derived from the salt the gateway already
issues, under a keyed hash, so the salt never leaves the gateway in a second place and the tag changes with the
salt's epoch and, for per-user isolation, with the user.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import msgspec

from gateway.policy.model import OffloadPolicy, PoolConfig

TAG_NAME = "kvgate"
TAG_KEY = f"lmcache.tag.{TAG_NAME}"
SKIP_SAVE_KEY = "lmcache.skip_save"
TAG_CONTEXT = b"kvgate-lmcache-tag-v1\0"
TAG_HEX_CHARS = 32  # 128 bits: collisions are not a practical concern, and LMCache's object keys stay short


def derive_tag(secret: bytes, salt: str) -> str:
    """Hex tag for one issued salt: HMAC(secret, context | salt); never the salt itself."""
    return hmac.new(secret, TAG_CONTEXT + salt.encode(), hashlib.sha256).hexdigest()[:TAG_HEX_CHARS]


def lmcache_params(secret: bytes, salt: str | None, caps: OffloadPolicy, sent: dict[str, Any]) -> dict[str, Any]:
    """The `lmcache.*` entries for one request: the tenant tag, and `skip_save` when nothing may be stored.

    `sent` is the request's already-capped `kv_transfer_params`; LMCache has no partial store cap, so only
    a store cap of 0 (from the policy or the client) can be honoured, as `lmcache.skip_save`.
    """
    params: dict[str, Any] = {}
    if salt is not None:
        params[TAG_KEY] = derive_tag(secret, salt)
    if caps.max_offload_tokens == 0 or sent.get("max_offload_tokens") == 0:
        params[SKIP_SAVE_KEY] = True
    return params


def body_for_pool(request: dict[str, Any], lmcache: dict[str, Any], pool: PoolConfig) -> bytes:
    """The rewritten request as it goes to one pool: with the `lmcache.*` entries only when the pool runs LMCache."""
    if not pool.lmcache or not lmcache:
        return msgspec.json.encode(request)
    params = request.get("kv_transfer_params")
    merged = {**(params if isinstance(params, dict) else {}), **lmcache}
    return msgspec.json.encode({**request, "kv_transfer_params": merged})
