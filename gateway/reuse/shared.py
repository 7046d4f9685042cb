"""Admission on the request path: the per-tenant doorkeepers of one gateway process, local or shared in Redis.

Local (no `KVGATE_REDIS_URL`): one `Doorkeeper` per tenant whose policy says `returning`, in this process.
Shared (`KVGATE_REDIS_URL` set, through the process's one Redis pool, gateway.storage): the same sketch lives in
Redis, one string per tenant and generation
(`kvgate:admission:<tenant>:<window>:<generation>`, 8-bit counters read and raised by BITFIELD inside one Lua
call, so a request costs one round trip and replicas count each other's requests). Generation numbers come
from the wall clock, so replicas agree on them without talking; each generation expires after a window. When
Redis does not answer, the local sketch (which every request also feeds) decides, and
`kvgate_offload_admission_errors_total` counts it; after a failure Redis is left alone for REDIS_BACKOFF_S, so
a hung Redis costs one request its timeout, not every request. A Redis outage changes only which requests
count.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from gateway.log import get_logger
from gateway.policy.model import AdmissionPolicy
from gateway.reuse.admission import (
    DEFAULT_WIDTH,
    AdmissionResult,
    AdmissionRule,
    Doorkeeper,
    admit_key,
    decide,
    generation,
    holds_a_chunk,
    prompt_key,
    row_offsets,
)
from gateway.reuse.fingerprint import tenant_trace_key
from gateway.storage import Storage, errors_with_redis

if TYPE_CHECKING:
    import redis.asyncio as aioredis

log = get_logger(__name__)
KEY_PREFIX = "kvgate:admission"
REDIS_TIMEOUT_S = 0.25
REDIS_BACKOFF_S = 2.0  # after a failure, the local sketch decides alone this long (no request waits on a dead Redis)
SHORT = AdmissionResult("short", 0)  # a prompt without a whole chunk: nothing to count

# KEYS: current generation, previous generation. ARGV: ttl seconds, then DEPTH byte offsets.
# Returns the count seen before this request (sum of both generations, minimum over the rows), and raises
# the current generation's counters at that minimum (conservative update, saturating at 255).
OBSERVE_LUA = """
local n = #ARGV - 1
local get = {}
for i = 1, n do
  get[#get + 1] = 'GET'; get[#get + 1] = 'u8'; get[#get + 1] = '#' .. ARGV[i + 1]
end
local cur = redis.call('BITFIELD', KEYS[1], unpack(get))
local prev = redis.call('BITFIELD_RO', KEYS[2], unpack(get))
local seen = 1000
for i = 1, n do
  local total = cur[i] + prev[i]
  if total < seen then seen = total end
end
local inc = {'OVERFLOW', 'SAT'}
for i = 1, n do
  if cur[i] + prev[i] == seen then
    inc[#inc + 1] = 'INCRBY'; inc[#inc + 1] = 'u8'; inc[#inc + 1] = '#' .. ARGV[i + 1]; inc[#inc + 1] = 1
  end
end
redis.call('BITFIELD', KEYS[1], unpack(inc))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return seen
"""


def rule_of(policy: AdmissionPolicy) -> AdmissionRule:
    return AdmissionRule(policy.mode, policy.window_s, policy.min_seen, policy.prefix_chunks)


class Admission:
    """Decides `returning` tenants' requests; local sketches always, Redis when configured."""

    def __init__(self, secret: bytes, redis_client: aioredis.Redis | None = None, width: int = DEFAULT_WIDTH) -> None:
        self.secret = secret
        self.width = width
        self.redis_client = redis_client
        self._observe = redis_client.register_script(OBSERVE_LUA) if redis_client is not None else None
        self._keepers: dict[str, Doorkeeper] = {}  # bounded: tenants come only from the policy set
        self._trace_keys: dict[str, bytes] = {}
        self._redis_retry_at = 0.0  # monotonic time before which Redis is not asked

    @classmethod
    def on(cls, storage: Storage, secret: bytes, width: int = DEFAULT_WIDTH) -> Admission:
        """Shared through the process's Redis pool when storage is Redis; local sketches only otherwise."""
        return cls(secret, storage.redis, width)

    def key_for(self, tenant: str, prompt: str | list[int] | None, prefix_chunks: int) -> bytes | None:
        if prompt is None or not holds_a_chunk(prompt):  # no whole chunk: no key, and no keyed hash state made
            return None
        trace_key = self._trace_keys.get(tenant)
        if trace_key is None:
            trace_key = self._trace_keys[tenant] = tenant_trace_key(self.secret, tenant)
        return prompt_key(trace_key, prompt, prefix_chunks)

    async def admit(self, tenant: str, key: bytes | None, rule: AdmissionRule) -> tuple[AdmissionResult, bool]:
        """The decision for one request, and whether the shared store failed (the local sketch decided)."""
        if key is None:  # `short`: nothing to count (the sketch is made by the first request with a key)
            return SHORT, False
        now = time.time()
        keeper = self._keepers.get(tenant)
        if keeper is None:
            keeper = self._keepers[tenant] = Doorkeeper(self.width)
        local = admit_key(keeper, key, now, rule)
        if self._observe is None:
            return local, False
        if time.monotonic() < self._redis_retry_at:
            return local, True
        try:
            seen = await self._shared_seen(tenant, key, now, rule)
        except errors_with_redis(OSError, TimeoutError) as error:
            self._redis_retry_at = time.monotonic() + REDIS_BACKOFF_S
            log.warning("admission_store_unavailable", tenant=tenant, error=type(error).__name__)
            return local, True
        return AdmissionResult(decide(seen, rule), seen), False

    async def _shared_seen(self, tenant: str, key: bytes, now: float, rule: AdmissionRule) -> int:
        assert self._observe is not None
        number = generation(now, rule.window_s)
        base = f"{KEY_PREFIX}:{tenant}:{rule.window_s:g}"
        ttl = max(1, int(rule.window_s) + 1)
        async with asyncio.timeout(REDIS_TIMEOUT_S):  # the pool's own timeout is longer than a request should wait
            seen = await self._observe(keys=[f"{base}:{number}", f"{base}:{number - 1}"],
                                       args=[ttl, *row_offsets(key, self.width)])
        return int(seen)

    def memory_bytes(self) -> int:
        return sum(keeper.memory_bytes for keeper in self._keepers.values())
