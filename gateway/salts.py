"""Derived `cache_salt` values (docs/policies.md): HMAC-SHA256(secret, tenant:epoch[:user]), hex.

64 hex characters stay within vLLM's limits (at most 128 characters, none of `@ / \\` or NUL).
Salts are derived on demand and never stored or logged.
"""

from __future__ import annotations

import hashlib
import hmac


def derive_salt(secret: bytes, tenant: str, epoch: int, user: str | None = None) -> str:
    message = f"{tenant}:{epoch}" if user is None else f"{tenant}:{epoch}:{user}"
    return hmac.new(secret, message.encode(), hashlib.sha256).hexdigest()
