"""The miss path: a request whose answer fails before its first byte is answered by recomputing instead.

Loading blocks from the offload tier is an optimisation; a failed load must not become a failed request. For a
tenant with `offload.miss_path: retry`, an answer that fails before the gateway has sent any of its content to
the client -- a connection refused or reset, a timeout, a 5xx status, or (streams) an error event before any
generated content -- is retried once on the same pool with a forced recompute, then once on the tenant's
`rollout.else_pool` if it has one. After the first content nothing is retried. (A stream's head may have gone out
already: gateway/proxy/forward.py's ResponseHead says when.)

How a recompute is forced depends on the server (the pool's `recompute` field):
- `max_load_tokens`: `kv_transfer_params.max_load_tokens: 0` -- no external load, the GPU prefix cache is kept.
  Only for servers that read it: vLLM 0.25.0's offloading scheduler ignores it (measured on the H200,
  tests/fixtures/vllm-0.25.0/kv-transfer-params/steps.json); the 0.32.0 build reads it.
- `salt`: a one-time `cache_salt` derived for this request only, so nothing cached matches (neither tier) and
  the whole prompt is prefilled; `max_offload_tokens: 0` keeps the one-time copy out of the CPU tier. The salt
  is registered with the ledger like a per-user salt, so the GPU blocks it creates stay attributed.
- `auto` (default): ask `GET /version` of the upstream once; `max_load_tokens` from 0.32.0 on, else `salt`
  (also when the version cannot be read).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import msgspec

from gateway.asgi.inline import Step
from gateway.metrics import GatewayMetrics
from gateway.policy.model import PoolConfig
from gateway.proxy.features import Call, Outbound
from gateway.proxy.smallcalls import SmallCalls, client_error, read_small, total_timeout
from gateway.proxy.sse import OutcomeScreen
from gateway.proxy.upstream import Sink
from gateway.routes import Kind
from gateway.salts import derive_salt

RecomputeMethod = Literal["max_load_tokens", "salt"]
Action = Literal["recompute_max_load_tokens", "recompute_salt", "else_pool"]
UserSaltSink = Callable[[str, int, str], None]
HONOURS_MAX_LOAD_FROM = (0, 32, 0)
VERSION_TIMEOUT_S = 2.0
MAX_REMEMBERED_UPSTREAMS = 1024
PEEK_LIMIT_BYTES = 64 * 1024  # an answer with no content after this much is relayed as it is
VERSION_NUMBERS = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")


def honours_max_load_tokens(version: str) -> bool:
    """Whether a vLLM of this version reads `max_load_tokens` (unknown or unparsable: no)."""
    match = VERSION_NUMBERS.match(version.strip().lstrip("v"))
    if match is None:
        return False
    numbers = tuple(int(part or 0) for part in match.groups())
    return numbers >= HONOURS_MAX_LOAD_FROM


class RecomputeMethods:
    """Per upstream, how a recompute is forced; `auto` pools are asked for their version once."""

    def __init__(self, calls: SmallCalls) -> None:
        self.calls = calls
        self._known: dict[str, RecomputeMethod] = {}

    async def method(self, pool: PoolConfig, upstream: str) -> RecomputeMethod:
        if pool.recompute != "auto":
            return pool.recompute
        known = self._known.get(upstream)
        if known is not None:
            return known
        version = await self._version(upstream)
        method: RecomputeMethod = "max_load_tokens" if version and honours_max_load_tokens(version) else "salt"
        if version is not None:
            if len(self._known) >= MAX_REMEMBERED_UPSTREAMS:
                self._known.clear()
            self._known[upstream] = method
        return method

    async def _version(self, upstream: str) -> str | None:
        session = await self.calls.session()
        try:
            async with session.get(f"{upstream}/version", timeout=total_timeout(VERSION_TIMEOUT_S)) as response:
                body = await read_small(response)
        except (client_error(), TimeoutError):
            return None
        try:
            parsed = msgspec.json.decode(body)
        except msgspec.DecodeError:
            return None
        version = parsed.get("version") if isinstance(parsed, dict) else None
        return version if isinstance(version, str) else None


def one_time_user(request_id: str) -> str:
    """The per-request identity a one-time salt is derived from (like a per-user salt, never reused)."""
    return f"kvgate-recompute:{request_id}"


def recompute_body(body: bytes, method: RecomputeMethod, one_time_salt: str) -> bytes:
    """The retry's body: the same request with external loads off, or with a salt nothing matches."""
    request: dict[str, Any] = msgspec.json.decode(body)
    params = request.get("kv_transfer_params")
    caps: dict[str, Any] = dict(params) if isinstance(params, dict) else {}
    if method == "max_load_tokens":
        caps["max_load_tokens"] = 0
    else:
        request["cache_salt"] = one_time_salt
        caps["max_offload_tokens"] = 0
    request["kv_transfer_params"] = caps
    return msgspec.json.encode(request)


def action_for(method: RecomputeMethod) -> Action:
    return "recompute_max_load_tokens" if method == "max_load_tokens" else "recompute_salt"


@dataclass
class Failure:
    """An answer that failed before any of its content reached the client."""

    cause: str  # connect/timeout error name, `status_<code>`, `error_event`, or `unreadable_after_head`
    error: Exception | None = None  # the gateway error to raise if this is the last word
    status: int = 0
    body: bytes = b""
    content_type: str = "application/json"
    chunks: list[bytes] = field(default_factory=list)  # a stream that began with an error event


class ErrorFirst(Exception):
    """Raised by HeldUntilContent: the stream's first event is an error, and none of its body has been sent."""


class HeldBack:
    """A stream's first reads, held until they show generated content, an error event before any content
    (ErrorFirst), or PEEK_LIMIT_BYTES without either."""

    __slots__ = ("_screen", "held", "size")

    def __init__(self) -> None:
        self.held: list[bytes] = []
        self.size = 0
        self._screen = OutcomeScreen()  # each event read once, however the upstream cuts its writes

    def screen(self, chunk: bytes) -> Literal["content", "limit"] | None:
        """Hold `chunk`; what the stream shows so far (None: neither content nor an error yet)."""
        self.held.append(chunk)
        self.size += len(chunk)
        outcome = self._screen.feed(chunk)  # read as events, whatever JSON or SSE style upstream writes
        if outcome == "error":
            raise ErrorFirst()
        if outcome == "content":
            return "content"
        return "limit" if self.size > PEEK_LIMIT_BYTES else None


class HeldUntilContent(HeldBack):
    """The miss path's sink for a streamed relay (a `Sink` of UpstreamConnection.pump), run in the read callback
    as the plain relay's is: it holds the stream's reads until `screen` lets them go, then starts the response
    (unless its head went out already: `start` returns None then), passes on everything held in one write, and
    redirects the pump to the relay's own sink for every later read. ErrorFirst, raised before any of the body was
    sent, leaves the request free to be retried.

    `peek_stream` does the same from the request task, which then wakes for each read before the first token and
    once more to send, all on the path to the client's first token; only an assembled answer (sent whole at the
    end) still peeks that way."""

    __slots__ = ("_pass_on", "_redirect", "_start", "released")

    def __init__(self, pass_on: Sink, start: Callable[[bool], Step | None], redirect: Callable[[Sink], None]) -> None:
        super().__init__()
        self._pass_on = pass_on  # the relay's sink, once released
        self._start = start  # starts the response; told whether content was seen (its TTFT)
        self._redirect = redirect  # the pump's: every read after the release goes straight to `pass_on`
        self.released = False

    def pass_on(self, chunk: bytes) -> Step | None:
        found = self.screen(chunk)
        if found is None:
            return None
        started = self._start(found == "content")
        held = self.take_held()
        self._redirect(self._pass_on)
        if started is None:
            return self._pass_on(held)
        return self._after(started, held)

    def take_held(self) -> bytes:
        """Everything held, once; whatever follows is passed straight on."""
        held = b"".join(self.held)
        self.held, self.released = [], True
        return held

    async def _after(self, started: Step, held: bytes) -> None:
        await started
        if (rest := self._pass_on(held)) is not None:
            await rest


@dataclass
class Peeked:
    """The first chunks of a stream, read until generated content, an error event or the end."""

    chunks: list[bytes]
    error_first: bool


class ChunkSource(Protocol):
    async def next_chunk(self) -> bytes: ...


async def peek_stream(response: ChunkSource) -> Peeked:
    """Hold a stream back until it shows content (relay it) or an error before any content (retry it)."""
    held = HeldBack()
    try:
        while chunk := await response.next_chunk():
            if held.screen(chunk) is not None:
                return Peeked(held.held, False)
    except ErrorFirst:
        return Peeked(held.held + await rest_of_error(response, held.size), True)
    return Peeked(held.held, False)


async def rest_of_error(response: ChunkSource, read: int) -> list[bytes]:
    """What follows an error event (normally just `[DONE]`), bounded."""
    rest = []
    while chunk := await response.next_chunk():
        read += len(chunk)
        if read > PEEK_LIMIT_BYTES:
            break
        rest.append(chunk)
    return rest


class MissPath:
    """What a retry needs besides the request: how to force a recompute per pool, salts, and the metric."""

    def __init__(self, calls: SmallCalls, salt_secret: bytes, metrics: GatewayMetrics,
                 remember_user_salt: UserSaltSink) -> None:
        self.recompute = RecomputeMethods(calls)
        self.salt_secret = salt_secret
        self.metrics = metrics
        self.remember_user_salt = remember_user_salt

    @staticmethod
    def applies(call: Call) -> bool:
        generation = call.route.kind is Kind.GENERATE and call.prepared is not None
        return generation and call.tenant.offload.miss_path == "retry"

    @staticmethod
    def retry_pools(call: Call) -> list[str]:
        """Recompute on the same pool, then the rollout's other arm when there is one."""
        else_pool = call.tenant.rollout.else_pool
        return [call.pool_name] + ([else_pool] if else_pool is not None and else_pool != call.pool_name else [])

    async def retry_outbound(
        self, call: Call, outbound: Outbound, candidates: list[str], pool_name: str, retry_id: str
    ) -> tuple[Outbound, Action]:
        """The retry of `outbound` on `pool_name`: recompute forced as that pool's server allows."""
        prepared = call.prepared
        assert prepared is not None and outbound.body is not None
        pool = call.policies.gateway.pools[pool_name]
        method = await self.recompute.method(pool, candidates[0])
        tenant = call.tenant
        salt = ""
        if method == "salt":
            user = one_time_user(call.request_id)
            salt = derive_salt(self.salt_secret, tenant.tenant, tenant.cache.salt_epoch, user)
            self.remember_user_salt(tenant.tenant, tenant.cache.salt_epoch, user)  # its blocks stay attributed
        kept = {name: value for name, value in outbound.headers.items() if name != "authorization"}
        headers = kept | {"x-request-id": retry_id} | call.policies.pool_auth(pool_name)
        body = recompute_body(outbound.body, method, salt)
        action: Action = action_for(method) if pool_name == call.pool_name else "else_pool"
        return Outbound(outbound.method, candidates, outbound.target, headers, body), action

    def count(self, call: Call, pool: str, action: Action, ok: bool) -> None:
        self.metrics.miss_path.labels(call.tenant.tenant, pool, action, "ok" if ok else "failed").inc()
