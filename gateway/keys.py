"""API keys: generation and the hash that policies store instead of the key."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "kvg_"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hash_key_bytes(key.encode())


def hash_key_bytes(key: bytes) -> str:
    """The policy hash of a key as it arrived in a header (any bytes; UTF-8 keys hash as `hash_key`)."""
    return hashlib.sha256(key).hexdigest()


def policy_line(key: str) -> str:
    """The YAML to paste under the tenant's `keys:`."""
    return f'  - sha256: "{hash_key(key)}"\n    scopes: [inference]'
