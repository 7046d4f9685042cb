"""The simulated engine: one prefill at a time, cache lookups and stores, and the TTFT model.

A request waits for the engine (`num_requests_waiting`), then is scheduled: its prompt blocks are looked up
in the GPU prefix cache (all leading cached full blocks, except that the last prompt token is always
recomputed, so a repeated 1000-token prompt reports 992 cached tokens with 16-token blocks), then in the CPU
tier beyond the GPU hit; its blocks are referenced or newly cached (evicting LRU unreferenced blocks).
Prefill takes

    base_ttft_ms + computed * prefill_us_per_token + gpu_hit * cached_us_per_token + loaded * load_us_per_token

and prefills are serialised, so TTFT grows with load. Decoding is concurrent: each further token takes
`decode_ms_per_token`. When a request ends (or is aborted), the full blocks its generated tokens filled are
cached too, and its blocks are released tail first. The simulator never preempts or waits for KV space: a
prompt that does not fit leaves its tail uncached.

A CPU-tier load can be made to fail (`--fail-loads RATE`, or `[[sim:fail-load]]` in the prompt), as vLLM's
`kv_load_failure_policy` describes: with `fail` the request ends after its planned prefill time without a token
(the blocks it was filling are dropped from the GPU cache, with removal events) and the client gets vLLM's
error -- a 500 body, or for a stream, whose headers vLLM sends before the engine runs, an error event and
`[DONE]`; with `recompute` the failed tokens are prefilled instead (no load is counted, the bad chunks leave the
CPU tier and are stored again after prefill). Either way `load_failures` in /sim/state counts it.
With `--ignore-max-load-tokens` the lookup loads the whole CPU hit whatever `max_load_tokens` says, as vLLM
0.25.0 does (measured on the H200: tests/fixtures/vllm-0.25.0/kv-transfer-params/steps.json).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.sim import kv_events
from gateway.sim.config import SimConfig
from gateway.sim.gpu_cache import Acquired, PrefixCache
from gateway.sim.hashing import chain_hashes
from gateway.sim.kv_events import Event, EventSink
from gateway.sim.lmcache import LMCacheConnector
from gateway.sim.metrics import FinishStats, PrefillStats, SimMetrics
from gateway.sim.offload import OffloadConnector
from gateway.sim.protocol import GenRequest


@dataclass
class Run:
    """One request inside the engine."""

    request: GenRequest
    arrival: float
    hashes: list[int]
    scheduled_at: float
    gpu_hit: int = 0
    loaded: int = 0
    prefill_s: float = 0.0
    first_token_at: float | None = None
    taken: Acquired = field(default_factory=Acquired)
    new_blocks: list[int] = field(default_factory=list)  # blocks this request fills (not GPU hits)
    pending: list[Event] = field(default_factory=list)
    load_failed: bool = False  # a CPU-tier load failed under the `fail` policy: no token will come

    @property
    def cached_tokens(self) -> int:
        return self.gpu_hit + self.loaded

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt)


class LoadFailed(Exception):
    """The request's CPU-tier load failed and the server's kv_load_failure_policy is `fail`."""


class Engine:
    """Serialises prefills, owns the GPU cache (and the CPU tier) and reports to metrics and events."""

    def __init__(self, config: SimConfig, metrics: SimMetrics, sink: EventSink) -> None:
        self.config = config
        self.metrics = metrics
        self.sink = sink
        self.cache = PrefixCache(config.gpu_blocks)
        self.offload = (
            OffloadConnector(config, metrics.offload, sink.enabled) if metrics.offload is not None else None
        )
        self.lmcache = LMCacheConnector(config, sink.enabled) if config.lmcache else None
        self.waiting = 0
        self.running = 0
        self.load_failures = 0
        self._rng = random.Random(config.seed)
        self._lock = asyncio.Lock()

    async def prefill(self, request: GenRequest, arrival: float) -> Run:
        """Wait for the engine, prefill, and return the running request (its first token is ready)."""
        hashes = chain_hashes(request.prompt, self.config.block_size, request.cache_salt)
        await self._enter()
        try:
            run = self._schedule(request, hashes, arrival)
            await self._compute(run)
        finally:
            self._lock.release()
        if run.load_failed:
            raise LoadFailed("KV cache load failed")
        return run

    def finish(self, run: Run, output: Sequence[int], reason: str) -> None:
        """End a request: cache the blocks its output filled, release its blocks, record metrics."""
        decode_taken = self._cache_output_blocks(run, output)
        self.cache.release(decode_taken)
        self.cache.release(run.taken)
        self.running -= 1
        self._update_gauges()
        self.metrics.observe_finish(self._finish_stats(run, len(output), reason))

    def reset_prefix_cache(self, reset_external: bool) -> bool:
        """Clear the GPU cache (refused while requests hold blocks); the CPU tier too when asked."""
        if not self.cache.clear():
            return False
        if self.sink.enabled:
            self.sink.publish([kv_events.all_cleared()])
        if reset_external and self.offload is not None:
            self.offload.tier.clear()
        if reset_external and self.lmcache is not None:
            self.lmcache.clear()
        self._update_gauges()
        return True

    async def _enter(self) -> None:
        self.waiting += 1
        self._update_gauges()
        try:
            await self._lock.acquire()
        finally:
            self.waiting -= 1
            self._update_gauges()

    async def _compute(self, run: Run) -> None:
        try:
            await asyncio.sleep(run.prefill_s)
        except asyncio.CancelledError:
            self._publish(run.pending, run.request.cache_salt)
            self.finish(run, (), "abort")
            raise
        if run.load_failed:
            self._abandon(run)
        else:
            self._complete_prefill(run)

    def _abandon(self, run: Run) -> None:
        """End a request whose load failed: the blocks it was filling hold nothing valid, so they leave the cache."""
        self._publish(run.pending, run.request.cache_salt)
        self.finish(run, (), "error")
        dropped = self.cache.drop(run.new_blocks)
        self._publish([kv_events.gpu_removed(block) for block in dropped] if self.sink.enabled else [], None)
        self._update_gauges()

    def _load_fails(self, run: Run) -> bool:
        if not run.loaded:
            return False
        if run.request.directives.fail_load:
            return True
        return self.config.fail_loads > 0 and self._rng.random() < self.config.fail_loads

    def _apply_load_failure(self, run: Run) -> None:
        self.load_failures += 1
        if self.config.load_failure_policy == "fail":
            run.load_failed = True
            return
        assert self.offload is not None
        run.pending += self.offload.discard(run.hashes, run.gpu_hit, run.loaded)  # the bad copies are gone
        run.loaded = 0

    def _schedule(self, request: GenRequest, hashes: list[int], arrival: float) -> Run:
        """Look the prompt up, take its blocks and prepare its events (under the engine lock)."""
        run = Run(request, arrival, hashes, time.monotonic())
        first = self._lookup(run)
        hits = self.cache.acquire(hashes[:first])
        partial_blocks = -(-run.prompt_len // self.config.block_size) - len(hashes)
        run.taken = self.cache.acquire(hashes[first:], partial_blocks)
        new = Acquired(list(run.taken.held), 0, run.taken.evicted)
        run.new_blocks = list(new.held)
        run.taken.held[:0] = hits.held
        run.pending = self._stored_events(request.prompt, hashes, first, new, request.cache_salt)
        if self._load_fails(run):
            self._apply_load_failure(run)
        run.prefill_s = self._prefill_seconds(run)
        self.running += 1
        self._update_gauges()
        return run

    def _lookup(self, run: Run) -> int:
        """Set the run's GPU hit (never the last prompt token) and CPU-loadable tokens; returns the number
        of GPU-hit blocks."""
        size = self.config.block_size
        hit_blocks = min(self.cache.match(run.hashes), (run.prompt_len - 1) // size)
        run.gpu_hit = hit_blocks * size
        if self.offload is not None:
            max_load = None if self.config.ignore_max_load_tokens else run.request.caps.max_load_tokens
            run.loaded = self.offload.hit_tokens(run.hashes, run.gpu_hit, max_load)
        if self.lmcache is not None:
            request = run.request
            run.loaded = self.lmcache.hit_tokens(request.prompt, request.body, request.cache_salt, run.gpu_hit)
        return hit_blocks

    def _prefill_seconds(self, run: Run) -> float:
        config = self.config
        computed = run.prompt_len - run.cached_tokens
        micros = (computed * config.prefill_us_per_token + run.gpu_hit * config.cached_us_per_token
                  + run.loaded * config.load_us_per_token)
        return config.base_ttft_ms / 1e3 + micros / 1e6

    def _stored_events(self, tokens: Sequence[int], hashes: Sequence[int], first: int, taken: Acquired,
                       salt: str | None) -> list[Event]:
        """GPU events of one step: blocks `first`.. of the chain `hashes` that `taken` (re)cached, then one
        removal per block evicted for them."""
        if not self.sink.enabled:
            return []
        size = self.config.block_size
        end = first + len(taken.held)
        events: list[Event] = []
        if taken.held:
            parent = hashes[first - 1] if first else None
            events.append(kv_events.gpu_stored(taken.held, parent, tokens[first * size : end * size], size, salt))
        return events + [kv_events.gpu_removed(block) for block in taken.evicted]

    def _complete_prefill(self, run: Run) -> None:
        run.first_token_at = time.monotonic()
        self._publish(run.pending, run.request.cache_salt)
        run.pending = []
        if self.offload is not None:
            self._offload_after_prefill(run)
        if self.lmcache is not None:
            self._lmcache_after_prefill(run, self.lmcache)
        connector = self.offload is not None or self.lmcache is not None
        self.metrics.observe_prefill(self._prefill_stats(run), connector)

    def _offload_after_prefill(self, run: Run) -> None:
        assert self.offload is not None
        if run.loaded:
            self.offload.load(run.hashes, run.gpu_hit, run.loaded)
        request = run.request
        self._publish(self.offload.store(request.prompt, run.hashes, request.caps.max_offload_tokens),
                      request.cache_salt)

    def _lmcache_after_prefill(self, run: Run, lmcache: LMCacheConnector) -> None:
        request = run.request
        if run.loaded:
            lmcache.load(request.prompt, request.body, request.cache_salt, run.loaded)
        self._publish(lmcache.store(request.prompt, request.body, request.cache_salt), request.cache_salt)

    def _prefill_stats(self, run: Run) -> PrefillStats:
        assert run.first_token_at is not None
        return PrefillStats(
            prompt_tokens=run.prompt_len,
            gpu_hit_tokens=run.gpu_hit,
            loaded_tokens=run.loaded,
            max_tokens=run.request.max_tokens,
            queue_s=run.scheduled_at - run.arrival,
            prefill_s=run.first_token_at - run.scheduled_at,
            ttft_s=run.first_token_at - run.arrival,
        )

    def _finish_stats(self, run: Run, output_tokens: int, reason: str) -> FinishStats:
        now = time.monotonic()
        decode_s = now - run.first_token_at if run.first_token_at is not None else 0.0
        return FinishStats(reason, output_tokens, now - run.arrival, decode_s, now - run.scheduled_at)

    def _cache_output_blocks(self, run: Run, output: Sequence[int]) -> Acquired:
        """Cache the full blocks that generated tokens completed (the last token's KV is never computed)."""
        size = self.config.block_size
        computed = run.prompt_len + max(len(output) - 1, 0)
        start = len(run.hashes)
        if computed // size <= start:
            return Acquired()
        tokens = [*run.request.prompt, *output[: computed - run.prompt_len]]
        parent = run.hashes[-1] if run.hashes else None
        new = chain_hashes(tokens, size, run.request.cache_salt, start, parent)
        taken = self.cache.acquire(new)
        chain = [*run.hashes, *new]
        self._publish(self._stored_events(tokens, chain, start, taken, run.request.cache_salt), run.request.cache_salt)
        return taken

    def _publish(self, events: list[Event], owner: str | None) -> None:
        """`owner`: the request's cache salt; new blocks in these events are its (the truth seam counts them)."""
        if events:
            self.sink.publish(events, owner)

    def _update_gauges(self) -> None:
        self.metrics.set_queue(self.waiting, self.running)
        self.metrics.kv_usage.set(self.cache.usage)

