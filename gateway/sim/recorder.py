"""The record of recent requests behind `GET /sim/requests` (a test seam; bounded, one per app).

Each record holds what a proxy's tests need to prove about what reached the server, never prompt or output
text: method, path, query, the `X-Request-Id`, the received headers (credentials -- authorization, x-api-key,
cookie, proxy-authorization -- only as the SHA-256 hex of their value, in `credential_sha256`), what the body
said about `model`, `cache_salt`, `kv_transfer_params`, `stream` and `stream_options`, token counts (cached
tokens split into `gpu_hit_tokens` and CPU `loaded_tokens`), the body's top-level field names (`body_keys`) and
its `store` value, `planned_prefill_ms` (the TTFT model's prefill time
for this request, without queueing or delay directives), the status sent and the outcome:

- `in_progress`: still running;
- `completed`: answered in full (including error replies, see `status`);
- `aborted`: the client went away first (generation was stopped);
- `dropped`: the simulator cut the connection on purpose (`[[sim:drop-after=N]]`);
- `load_failed`: a CPU-tier load failed under `--load-failure-policy fail` (an error reply or error event);
- `failed`: the simulator itself failed (a bug: see its log).
"""

from __future__ import annotations

import hashlib
import itertools
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from gateway.sim.asgi import HttpRequest

SECRET_HEADERS = ("authorization", "x-api-key", "cookie", "proxy-authorization")


@dataclass
class RequestRecord:
    seq: int
    received_at: float
    method: str
    path: str
    query: dict[str, list[str]]
    request_id: str | None
    headers: dict[str, str]
    credential_sha256: dict[str, str]
    status: int | None = None
    outcome: str = "in_progress"
    body_seen: bool = False
    model: str | None = None
    cache_salt_present: bool = False
    cache_salt: Any = None
    kv_transfer_params_present: bool = False
    kv_transfer_params: Any = None
    stream: Any = None
    stream_options_present: bool = False
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    gpu_hit_tokens: int | None = None
    loaded_tokens: int | None = None
    planned_prefill_ms: float | None = None
    completion_tokens: int | None = None
    body_keys: list[str] | None = None  # the body's top-level field names (never values)
    store: Any = None

    def note_body(self, body: dict[str, Any]) -> None:
        """Remember what the request body said about the fields a gateway rewrites."""
        self.body_seen = True
        self.model = body.get("model") if isinstance(body.get("model"), str) else None
        self.cache_salt_present = "cache_salt" in body
        self.cache_salt = body.get("cache_salt")
        self.kv_transfer_params_present = "kv_transfer_params" in body
        self.kv_transfer_params = body.get("kv_transfer_params")
        self.stream = body.get("stream")
        self.stream_options_present = "stream_options" in body
        self.body_keys = sorted(body)
        self.store = body.get("store")

    def note_prefill(self, gpu_hit: int, loaded: int, prefill_s: float) -> None:
        """The engine's view: cached tokens by tier and the TTFT model's prefill time (without queueing)."""
        self.gpu_hit_tokens = gpu_hit
        self.loaded_tokens = loaded
        self.cached_tokens = gpu_hit + loaded
        self.planned_prefill_ms = prefill_s * 1e3

    def finish(self, status: int, outcome: str = "completed") -> None:
        self.status = status
        self.outcome = outcome

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RequestRecorder:
    """The last `limit` requests this server received, oldest first."""

    def __init__(self, limit: int) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=limit)
        self._seq = itertools.count()

    def start(self, request: HttpRequest, keep: bool = True) -> RequestRecord:
        """A record of `request`, kept in the log unless `keep` is False (the seams themselves)."""
        headers = {k: v for k, v in request.headers.items() if k not in SECRET_HEADERS}
        credentials = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in request.headers.items()
                   if k in SECRET_HEADERS}
        record = RequestRecord(next(self._seq), time.time(), request.method, request.path, request.query,
                               request.headers.get("x-request-id"), headers, credentials)
        if keep:
            self._records.append(record)
        return record

    def snapshot(self) -> list[dict[str, Any]]:
        return [record.as_dict() for record in self._records]

    def clear(self) -> None:
        self._records.clear()
