"""The reuse trace: for each generation request, its prefix-fingerprint chain and usage, sampled and bounded.

Split in two so the request path stays cheap (loadtests/reuse_trace_cost.py measures it):

- `observe` runs at the end of a request, on the request path (called by gateway/reuse/trace_feature.py once the
  reply has been sent, with the parts of the prompt as the request carried it): it hashes only the *first* chunk,
  asks the tenant's SHARDS sampler whether that root is sampled, and queues the request. Everything it could
  refuse is counted in `kvgate_reuse_trace_requests_total{tenant,outcome}`.
- `run`, an owned background task, hashes the rest of each queued chain (yielding to the event loop every
  CHUNKS_PER_SLICE fingerprints, so a long prompt's chain never holds every stream's next event back for long),
  and writes records to the store in batches; it also applies the tenants' retention and the erasures that
  `tenant forget` asks for.

Bounded memory: at most `max_pending` queued requests holding at most `max_pending_units` prompt characters
or tokens (a token-id list still kept as JSON text counts one token per two bytes of it, the most it can hold),
at most `max_records_pending` records awaiting a write, and per tenant a sampler of at most `max_roots` roots.
Nothing here keeps text after the chain is computed; salts are never read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.log import get_logger
from gateway.metrics import ChildCache
from gateway.policy.loader import PolicySet
from gateway.proxy.sse import Usage
from gateway.reuse.fingerprint import (
    MAX_CHUNKS,
    KeptIds,
    PromptParts,
    continued_chain,
    fingerprints,
    id_pieces,
    parts_of,
    prompt_chunks,
    tenant_trace_key,
    token_chunks,
)
from gateway.reuse.record import TraceRecord
from gateway.reuse.sampling import CharsPerToken, ShardsSampler, root_value
from gateway.reuse.store import TraceStore

log = get_logger(__name__)
OUTCOMES = ("sampled", "unsampled", "no_prompt", "no_usage", "short_prompt", "dropped_queue_full", "erased_epoch",
            "error")
IDLE_FLUSH_S = 5.0  # without traffic, retention is still applied this often
RETRY_S = 1.0
# Fingerprints hashed between two yields to the event loop: about 0.2 ms on the 2-core box. A 128k-token prompt's
# chain is 4,096 fingerprints (3-6 ms there); hashed eight chains at a time, as until 2026-12-03, a burst of long
# prompts held every stream's next event back by tens of milliseconds.
CHUNKS_PER_SLICE = 256
TransferCaps = tuple[int | None, int | None]  # (max_offload_tokens, max_load_tokens) of a request


@dataclass(frozen=True)
class TraceSettings:
    block_tokens: int = 16  # vLLM's default GPU block size: token-id prompts chunk exactly by it
    sample_rate: float = 1.0  # the starting SHARDS rate; the fixed-size bound lowers it as needed
    max_roots: int = 20_000  # distinct sampled roots tracked per tenant
    max_pending: int = 4096  # requests queued for hashing
    max_pending_units: int = 16_000_000  # prompt characters or tokens held by queued requests
    max_records_pending: int = 20_000  # records awaiting a store write (kept while the store is down)
    flush_interval_s: float = 1.0
    default_chars_per_token: float = 4.0


class WorkSlices:
    """Yields to the event loop each time `size` units of work have been done since the last yield."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.done = 0

    async def room(self) -> int:
        """How much work may be done before the next yield (yielding first when none is left)."""
        if self.done >= self.size:
            await asyncio.sleep(0)
            self.done = 0
        return self.size - self.done

    def spent(self, units: int) -> None:
        self.done += units


class FinishedRequest(msgspec.Struct, frozen=True):
    """One finished generation request, as the trace sees it."""

    tenant: str
    epoch: int  # the tenant's salt epoch the request ran under
    pool: str
    parts: PromptParts | KeptIds | None  # references into the request body; None when it had no prompt to read
    usage: Usage | None
    user: str | None = None  # given only for tenants whose cache is isolated per end user
    caps: TransferCaps = (None, None)  # (max_offload_tokens, max_load_tokens) as sent upstream


class Job(msgspec.Struct, frozen=True):
    """A sampled request waiting for its full chain."""

    ts: float
    tenant: str
    pool: str
    epoch: int
    prompt: PromptParts | KeptIds  # references into the request body; rendered and hashed in the background
    length: int  # tokens or characters (at most, for a token-id list kept as JSON text)
    usage: Usage
    units: int
    chars_per_token: float
    rate: float
    key: bytes  # the tenant's fingerprint key (per end user when the tenant's cache is isolated per user)
    caps: TransferCaps  # (max_offload_tokens, max_load_tokens) as sent upstream


class TenantTrace:
    """Per-tenant state: the fingerprint key, the sampler and the characters-per-token estimate."""

    def __init__(self, key: bytes, settings: TraceSettings) -> None:
        self.key = key
        self.sampler = ShardsSampler(settings.sample_rate, settings.max_roots)
        self.chars_per_token = CharsPerToken(settings.default_chars_per_token)


class TraceMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("kvgate_reuse_trace_requests", "Generation requests seen by the reuse trace, by "
                                "outcome.", ["tenant", "outcome"], registry=registry)
        self.rate = Gauge("kvgate_reuse_trace_sample_rate", "SHARDS sampling rate of the reuse trace.", ["tenant"],
                          registry=registry, multiprocess_mode="livemin")  # with workers: the lowest rate in use
        self.write_failures = Counter("kvgate_reuse_trace_write_failures", "Failed trace-store writes (the batch "
                                      "is kept and retried).", registry=registry)
        self.given_up = Counter("kvgate_reuse_trace_records_given_up", "Records dropped because the store stayed "
                                "unreachable beyond the pending bound.", registry=registry)
        self._requests = ChildCache(self.requests)

    def count(self, tenant: str, outcome: str) -> None:
        self._requests.get(tenant, outcome).inc()


class ReuseTrace:
    def __init__(self, store: TraceStore, secret: bytes, settings: TraceSettings, metrics: TraceMetrics,
                 policies: Callable[[], PolicySet]) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self._secret = secret
        self._policies = policies
        self._tenants: dict[str, TenantTrace] = {}
        self._jobs: deque[Job] = deque()
        self._pending_units = 0
        self._records: list[TraceRecord] = []
        self._erase: dict[str, int] = {}  # tenant → erase everything below this salt epoch
        self._epochs = {name: t.cache.salt_epoch for name, t in policies().tenants.items()}
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()

    # -- the request path -------------------------------------------------------------------------------

    def observe(self, request: FinishedRequest) -> str:
        """Note one finished generation request; returns the outcome it was counted under. A request with a
        `user` gets fingerprints of its own: blocks isolated per end user are never shared, so neither are
        their fingerprints."""
        outcome = self._admit(request)
        self.metrics.count(request.tenant, outcome)
        return outcome

    def _admit(self, request: FinishedRequest) -> str:
        if request.epoch < self._epochs.get(request.tenant, request.epoch):
            # Started under the salt epoch that `tenant forget` erased and finished after the reload that
            # erased it: recording it now would bring back what the erasure removed.
            return "erased_epoch"
        parts, usage, user = request.parts, request.usage, request.user
        length = parts.units if parts is not None else 0
        if parts is None or not length:
            return "no_prompt"
        if usage is None or usage.prompt_tokens <= 0:
            return "no_usage"
        state = self._tenant(request.tenant)
        text = parts.is_text
        if text:  # observed first: a tenant's very first text request is already cut at its own ratio
            state.chars_per_token.observe(length, usage.prompt_tokens)
        chars_per_token = state.chars_per_token.current
        units = max(1, round(self.settings.block_tokens * chars_per_token)) if text else self.settings.block_tokens
        if length < units:  # not one whole block: nothing vLLM could reuse
            return "short_prompt"
        key = state.key if user is None else hmac.new(state.key, b"user:" + user.encode(), hashlib.sha256).digest()
        root = fingerprints(key, parts.head(units), self.settings.block_tokens, chars_per_token)[0]
        if not state.sampler.admit(root_value(root)):
            return "unsampled"
        if len(self._jobs) >= self.settings.max_pending or \
                self._pending_units + length > self.settings.max_pending_units:
            return "dropped_queue_full"
        self._jobs.append(Job(time.time(), request.tenant, request.pool, request.epoch, parts, length, usage, units,
                              chars_per_token, state.sampler.rate, key, request.caps))
        self._pending_units += length
        self._wake.set()
        return "sampled"

    def _tenant(self, tenant: str) -> TenantTrace:
        state = self._tenants.get(tenant)
        if state is None:  # tenants come from the policy set, so this map is bounded by it
            state = self._tenants[tenant] = TenantTrace(tenant_trace_key(self._secret, tenant), self.settings)
        return state

    # -- policy changes ------------------------------------------------------------------------------------

    def on_policies(self, policies: PolicySet) -> None:
        """A raised salt epoch (`tenant forget`) erases that tenant's trace below it, queued records included."""
        for name, tenant in policies.tenants.items():
            epoch = tenant.cache.salt_epoch
            if epoch > self._epochs.get(name, epoch):
                self._erase[name] = epoch
                self._jobs = deque(job for job in self._jobs if not (job.tenant == name and job.epoch < epoch))
                self._pending_units = sum(job.length for job in self._jobs)
                self._records = [r for r in self._records if not (r.tenant == name and r.epoch < epoch)]
                self._wake.set()
            self._epochs[name] = epoch

    # -- the background side -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Hash queued chains, write batches, apply retention; owned by the gateway's task supervisor."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=IDLE_FLUSH_S)
            await self.hash_pending()
            await asyncio.sleep(self.settings.flush_interval_s)
            if not await asyncio.shield(self.flush()):
                await asyncio.sleep(RETRY_S)

    async def hash_pending(self) -> None:
        slices = WorkSlices(CHUNKS_PER_SLICE)
        while self._jobs:
            job = self._jobs.popleft()
            self._pending_units -= job.length
            try:
                chain = await self._chain(job, slices)
            except asyncio.CancelledError:  # stopped mid-chain: the job goes back for close()'s flush
                self._jobs.appendleft(job)
                self._pending_units += job.length
                raise
            # A `tenant forget` may have come into force while this chain was being hashed (the loop ran
            # meanwhile): its erasure already went over the queue and the records, so this one is dropped here.
            if chain and job.epoch >= self._epochs.get(job.tenant, job.epoch):
                self._records.append(self._record(job, chain))
        self._bound_records()

    async def _chain(self, job: Job, slices: WorkSlices) -> list[bytes]:
        prompt: PromptParts | None
        if isinstance(job.prompt, KeptIds):
            pieces = id_pieces(job.prompt.raw)
            if pieces is not None:
                return await self._piecewise_chain(job.key, pieces, slices)
            prompt = parts_of(job.prompt)
            if prompt is None:
                return []
        else:
            prompt = job.prompt
        chunks = prompt_chunks(prompt.whole(), self.settings.block_tokens, job.chars_per_token, MAX_CHUNKS)
        return await _extended([], job.key, chunks, slices)

    async def _piecewise_chain(self, key: bytes, pieces: Iterator[list[object]], slices: WorkSlices) -> list[bytes]:
        """The chain of a kept token-id list, decoded a piece at a time with the hashing: never all of its ids as
        Python integers at once, and never the whole decode between two yields."""
        block = self.settings.block_tokens
        chain: list[bytes] = []
        left: list[object] = []  # the ids after the last whole block, carried to the next piece
        try:
            while len(chain) < MAX_CHUNKS:
                await slices.room()
                piece = next(pieces, None)
                if piece is None:
                    break
                ids = left + piece if left else piece
                chunks = token_chunks(ids, block, MAX_CHUNKS - len(chain))
                left = ids[len(chunks) * block:]
                slices.spent(len(chunks))  # the decode, counted like hashing as much
                chain = await _extended(chain, key, chunks, slices)
        except msgspec.DecodeError:  # a number beyond float range, which an engine refuses: nothing is recorded, as
            return []  # for a prompt the finish hook cannot read
        return chain

    def _record(self, job: Job, chain: list[bytes]) -> TraceRecord:
        text = job.prompt.is_text
        per_chunk = job.units * job.usage.prompt_tokens / job.length if text else float(job.units)
        return TraceRecord(ts=job.ts, tenant=job.tenant, pool=job.pool, epoch=job.epoch,
                           prompt_tokens=job.usage.prompt_tokens, cached_tokens=job.usage.cached_tokens,
                           completion_tokens=job.usage.completion_tokens, text=text, chunk_units=job.units,
                           tokens_per_chunk=per_chunk, rate=job.rate, chain=b"".join(chain),
                           max_offload_tokens=job.caps[0], max_load_tokens=job.caps[1])

    async def flush(self) -> bool:
        """Hash what is queued, apply erasures and retention, write the batch; False (batch kept) on failure."""
        async with self._writing:
            await self.hash_pending()
            records, self._records = self._records, []
            erase, self._erase = self._erase, {}
            if not self._jobs:
                self._wake.clear()
            try:
                for tenant, epoch in erase.items():
                    await self.store.erase(tenant, below_epoch=epoch)
                await self.store.write(records)
                await self._apply_retention()
            except Exception as error:  # an unreachable store must not lose the batch or stop the writer
                self._records[:0] = records
                for tenant, epoch in erase.items():
                    self._erase.setdefault(tenant, epoch)
                self._bound_records()
                self._wake.set()
                self.metrics.write_failures.inc()
                log.warning("reuse_trace_write_failed", records=len(records), error=type(error).__name__)
                return False
            self._publish_rates()
            return True

    async def _apply_retention(self) -> None:
        now = time.time()
        for name, tenant in self._policies().tenants.items():
            if tenant.offload.retention_seconds is not None:
                await self.store.expire(name, now - tenant.offload.retention_seconds)

    def _bound_records(self) -> None:
        excess = len(self._records) - self.settings.max_records_pending
        if excess > 0:
            del self._records[:excess]
            self.metrics.given_up.inc(excess)

    def _publish_rates(self) -> None:
        for name, state in self._tenants.items():
            self.metrics.rate.labels(name).set(state.sampler.rate)

    async def close(self) -> None:
        """Write what is still held (the store belongs to the process's Storage). Call after `run` is cancelled."""
        await self.flush()


async def _extended(chain: list[bytes], key: bytes, chunks: list[bytes], slices: WorkSlices) -> list[bytes]:
    """`chain` continued over `chunks`, hashed a slice at a time."""
    done = 0
    while done < len(chunks):
        part = chunks[done:done + await slices.room()]
        chain += continued_chain(key, part, chain[-1] if chain else b"")
        slices.spent(len(part))
        done += len(part)
    return chain
