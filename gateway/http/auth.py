"""Who is calling: API key extraction, hashed-key lookup, scope and path checks.

Runs before routing and before the body is read. Nothing here logs or returns key material.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable

from gateway.errors import BadRequest, Forbidden, Unauthorized
from gateway.keys import hash_key_bytes
from gateway.policy.loader import KeyGrant, PolicySet
from gateway.routes import RouteSpec

# Raw-path shapes that different servers resolve differently; refusing them keeps one meaning per path.
AMBIGUOUS_PATH = re.compile(rb"%(?:2f|5c|2e|00)|//|\\|(?:^|/)\.\.?(?:/|$)|[\x00-\x20\x7f]", re.IGNORECASE)


class AuthFailure(Unauthorized):
    """401 with a metric reason (`missing`, `malformed`, `conflicting`, `unknown_key`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message, code="invalid_api_key")
        self.reason = reason


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The key the client sent: its header bytes one to one as latin-1 text, so any byte sequence is carried
    unchanged (never decoded as UTF-8) and compared as bytes.

    Several Authorization or x-api-key headers must all carry the same key, and so must the two kinds:
    a front proxy that reads the first header must not authorize a different identity than kvgate does.
    """
    bearers, api_keys = _credential_headers(headers)
    if len(bearers) > 1 or len(api_keys) > 1:
        raise AuthFailure("conflicting", "Several Authorization or x-api-key headers carry different keys.")
    if not bearers and not api_keys:
        raise AuthFailure("missing", "An API key is required: send 'Authorization: Bearer <key>'.")
    if bearers and api_keys and not hmac.compare_digest(next(iter(bearers)), next(iter(api_keys))):
        raise AuthFailure("conflicting", "Authorization and x-api-key carry different keys.")
    return next(iter(bearers or api_keys)).decode("latin-1")


def _credential_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[set[bytes], set[bytes]]:
    bearers: set[bytes] = set()
    api_keys: set[bytes] = set()
    for name, value in headers:
        if name == b"authorization":
            bearers.add(_bearer_token(value))
        elif name == b"x-api-key":
            api_keys.add(value.strip())
    return bearers, api_keys


def _bearer_token(value: bytes) -> bytes:
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        raise AuthFailure("malformed", "The Authorization header must be 'Bearer <key>'.")
    return token.strip()


def authenticate(key: str, policies: PolicySet) -> KeyGrant:
    digest = hash_key_bytes(key_bytes(key))
    # The lookup is keyed by a SHA-256 of the presented secret, so its timing reveals nothing usable;
    # the final comparison is constant-time all the same.
    grant = policies.keys.get(digest)
    if grant is None or not hmac.compare_digest(grant.sha256.encode(), digest.encode()):
        raise AuthFailure("unknown_key", "The API key is not valid.")
    return grant


def key_bytes(key: str) -> bytes:
    """The bytes a key was sent as: latin-1 text from `presented_key` maps back one to one; a key given as other
    text (the CLI, tests) is UTF-8, which is how `kvgate keys hash` hashes it."""
    try:
        return key.encode("latin-1")
    except UnicodeEncodeError:
        return key.encode()


def check_path(raw_path: bytes) -> None:
    if AMBIGUOUS_PATH.search(raw_path):
        raise BadRequest("The request path is ambiguous (encoded separators, dot segments or '//').")


def authorize(grant: KeyGrant, route: RouteSpec) -> None:
    if route.scope is not None and route.scope not in grant.scopes:
        raise Forbidden(f"This key lacks the {route.scope!r} scope needed for {route.path}.")
