"""Who is calling: API key extraction, hashed-key lookup, scope and path checks.

Runs before routing and before the body is read. Nothing here logs or returns key material.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Iterable

from gateway.errors import BadRequest, Forbidden, Unauthorized
from gateway.keys import hash_key
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
    bearer, api_key = _credential_headers(headers)
    if bearer is None and api_key is None:
        raise AuthFailure("missing", "An API key is required: send 'Authorization: Bearer <key>'.")
    if bearer is not None and api_key is not None and not hmac.compare_digest(bearer, api_key):
        raise AuthFailure("conflicting", "Authorization and x-api-key carry different keys.")
    key = bearer if bearer is not None else api_key
    assert key is not None
    return key


def _credential_headers(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str | None, str | None]:
    bearer: str | None = None
    api_key: str | None = None
    for name, value in headers:
        if name == b"authorization":
            bearer = _bearer_token(value)
        elif name == b"x-api-key":
            api_key = value.decode("latin-1").strip()
    return bearer, api_key


def _bearer_token(value: bytes) -> str:
    scheme, _, token = value.decode("latin-1").strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthFailure("malformed", "The Authorization header must be 'Bearer <key>'.")
    return token.strip()


def authenticate(key: str, policies: PolicySet) -> KeyGrant:
    digest = hash_key(key)
    # The lookup is keyed by a SHA-256 of the presented secret, so its timing reveals nothing usable;
    # the final comparison is constant-time all the same.
    grant = policies.keys.get(digest)
    if grant is None or not hmac.compare_digest(grant.sha256, digest):
        raise AuthFailure("unknown_key", "The API key is not valid.")
    return grant


def check_path(raw_path: bytes) -> None:
    if AMBIGUOUS_PATH.search(raw_path):
        raise BadRequest("The request path is ambiguous (encoded separators, dot segments or '//').")


def authorize(grant: KeyGrant, route: RouteSpec) -> None:
    if route.scope is not None and route.scope not in grant.scopes:
        raise Forbidden(f"This key lacks the {route.scope!r} scope needed for {route.path}.")
