"""vLLM's `--api-key` middleware: only paths starting with /v1, /v2, /inference or /cohere are guarded.

Everything else (`/health`, `/metrics`, `/tokenize`, `/invocations`, `/reset_prefix_cache`, `/sim/...`) stays
open, as on a real server. The check is a plain string prefix (so `/v1xyz` is guarded), skips OPTIONS, wants
`Authorization: Bearer <key>` (scheme case-insensitive) and compares SHA-256 digests in constant time.
A failure is 401 with the body `{"error":"Unauthorized"}` (not the OpenAI error shape).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

GUARDED_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'


class ApiKeyGuard:
    def __init__(self, keys: Sequence[str]) -> None:
        self._digests = [hashlib.sha256(key.encode()).digest() for key in keys if key]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def guards(self, method: str, path: str) -> bool:
        return self.enabled and method != "OPTIONS" and path.startswith(GUARDED_PREFIXES)

    def accepts(self, authorization: str | None) -> bool:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any(secrets.compare_digest(digest, known) for known in self._digests)
