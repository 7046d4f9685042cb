"""Derived `cache_salt` values (docs/policies.md): HMAC-SHA256(secret, tenant:epoch[:user]), hex.

64 hex characters stay within vLLM's limits (at most 128 characters, none of `@ / \\` or NUL).
Salts are derived on demand and never stored or logged.
"""

from __future__ import annotations

import hashlib
import hmac

BLOCK_BYTES = 64  # SHA-256's block: HMAC pads its key to this
INNER_PAD = bytes(byte ^ 0x36 for byte in range(256))
OUTER_PAD = bytes(byte ^ 0x5C for byte in range(256))


def derive_salt(secret: bytes, tenant: str, epoch: int, user: str | None = None) -> str:
    return hmac.new(secret, _message(tenant, epoch, user), hashlib.sha256).hexdigest()


class Salts:
    """`derive_salt` for one secret, for the request path: HMAC's two padded key blocks are hashed once here, so a
    salt costs two copies of a hash state and two short updates. OpenSSL's HMAC set-up per call was about twice
    that (25 k against 12 k instructions per salt under callgrind), once per forwarded request. It holds the
    secret's key schedule, as the process holds the secret; never a salt."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, secret: bytes) -> None:
        key = (hashlib.sha256(secret).digest() if len(secret) > BLOCK_BYTES else secret).ljust(BLOCK_BYTES, b"\0")
        self._inner = hashlib.sha256(key.translate(INNER_PAD))
        self._outer = hashlib.sha256(key.translate(OUTER_PAD))

    def derive(self, tenant: str, epoch: int, user: str | None = None) -> str:
        inner = self._inner.copy()
        inner.update(_message(tenant, epoch, user))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.hexdigest()


def _message(tenant: str, epoch: int, user: str | None) -> bytes:
    return (f"{tenant}:{epoch}" if user is None else f"{tenant}:{epoch}:{user}").encode()
