"""Replay a reuse trace through a model of vLLM's two cache tiers: the GPU prefix cache and the CPU tier.

GPU prefix cache (vLLM's block pool, as in gateway/sim/gpu_cache.py): full blocks cached by chained hash; a
request hits its leading cached blocks, but never its last prompt token; its new blocks (and a slot for a
partial last block) take free space, evicting the least recently released unreferenced blocks; when it ends,
the full blocks its output completed are cached too, and its blocks are released tail first — so the end of a
prompt is evicted before its beginning. Requests are replayed one after another.

CPU tier (the OffloadingConnector's CPU spec): chunks of `offload_block_tokens`, keyed by their last block,
LRU. A request asks it only for what the GPU lacks: consecutive stored chunks from the chunk holding the
first missing token; fewer than one chunk's worth loads nothing. After prefill every full chunk of the prompt
is stored (or refreshed). Because every request references all of its chunks in order, the tier is a plain
LRU over that reference stream, so one pass computes each reference's stack distance and every tier size is
answered from it (a chunk is resident in a tier of C chunks iff fewer than C distinct chunks were referenced
since its own last reference).

Fingerprints stand for blocks: token-id prompts are exact when the trace's block size equals the server's;
text prompts are cut by characters, so block boundaries are approximate (`tokens_per_chunk`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.reuse.record import TraceRecord


@dataclass(frozen=True)
class CacheShape:
    gpu_blocks: float  # GPU prefix-cache capacity in blocks (scaled by the sampling rate when sampled)
    block_size: int  # tokens per GPU block
    offload_block_tokens: int = 64  # tokens per CPU-tier chunk


@dataclass
class RequestReplay:
    """What the model says one request got."""

    prompt_tokens: int
    gpu_hit: int
    cpu_distances: list[int]  # stack distance of each CPU chunk from the first one the GPU lacks (-1: never seen)
    start_offset: int  # tokens of the first looked-up chunk already covered by the GPU hit
    chunk_tokens: float
    root: bytes
    max_load: int | None = None  # the request's max_load_tokens, when the server honours it


@dataclass
class TierShares:
    """Token totals for one CPU-tier size."""

    cpu_chunks: int
    prompt_tokens: float = 0.0
    gpu_tokens: float = 0.0
    cpu_tokens: float = 0.0
    per_root: dict[bytes, tuple[float, float, float]] = field(default_factory=dict)  # root → (prompt, gpu, cpu)

    @property
    def gpu_share(self) -> float:
        return self.gpu_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def cpu_share(self) -> float:
        return self.cpu_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


class GpuModel:
    """The GPU prefix cache, in blocks (a text fingerprint may weigh a fraction of a block more or less)."""

    def __init__(self, capacity_blocks: float) -> None:
        self.capacity = capacity_blocks
        self._free: OrderedDict[bytes | int, float] = OrderedDict()  # unreferenced cached entries, LRU first
        self._used = 0.0  # weight of cached (free) entries
        self._junk = 0  # keys for output blocks, which no later prompt can match

    def request(self, chain: Sequence[bytes], weight: float, prompt_tokens: int, completion_tokens: int,
                block_size: int) -> int:
        """Replay one request; returns its GPU-hit tokens."""
        matched = 0
        for key in chain:
            if key not in self._free:
                break
            matched += 1
        held = [(key, self._free.pop(key)) for key in chain[:matched]]
        self._used -= matched * weight
        hit_blocks = min(matched * weight, (prompt_tokens - 1) // block_size)
        referenced = matched * weight
        partial = 1.0 if prompt_tokens % block_size else 0.0
        for key in chain[matched:]:  # new blocks, as long as room can be made
            if not self._make_room(referenced + weight):
                break
            held.append((key, weight))
            referenced += weight
        if partial and not self._make_room(referenced + partial):
            partial = 0.0
        output_blocks = (prompt_tokens + max(completion_tokens - 1, 0)) // block_size - prompt_tokens // block_size
        junk = self._junk_entry(output_blocks, referenced + partial)
        if junk is not None:
            self._free[junk[0]] = junk[1]
            self._used += junk[1]
        for key, entry_weight in reversed(held):  # released tail first: the end of the prompt is evicted first
            self._free[key] = entry_weight
            self._used += entry_weight
        return math.floor(hit_blocks) * block_size

    def _junk_entry(self, blocks: int, referenced: float) -> tuple[int, float] | None:
        taken = 0
        while taken < blocks and self._make_room(referenced + taken + 1):
            taken += 1
        if not taken:
            return None
        self._junk += 1
        return self._junk, float(taken)

    def _make_room(self, needed_referenced: float) -> bool:
        """Evict LRU entries until `needed_referenced` (referenced weight after the next allocation) fits."""
        while self._used + needed_referenced > self.capacity + 1e-9:
            if not self._free:
                return False
            _, evicted = self._free.popitem(last=False)
            self._used -= evicted
        return True


class StackDistances:
    """LRU stack distances of a reference stream (Fenwick tree over reference positions)."""

    def __init__(self, capacity: int) -> None:
        self._tree = [0] * (capacity + 1)
        self._last: dict[bytes, int] = {}
        self._position = 0
        self._distinct = 0

    def _add(self, index: int, delta: int) -> None:
        index += 1
        while index < len(self._tree):
            self._tree[index] += delta
            index += index & -index

    def _prefix(self, index: int) -> int:
        total = 0
        index += 1
        while index > 0:
            total += self._tree[index]
            index -= index & -index
        return total

    def distance(self, key: bytes) -> int:
        """Distinct keys referenced since `key` was last referenced (-1 if never); does not reference it."""
        last = self._last.get(key)
        if last is None:
            return -1
        return self._distinct - self._prefix(last)

    def reference(self, key: bytes) -> None:
        last = self._last.get(key)
        if last is not None:
            self._add(last, -1)
        else:
            self._distinct += 1
        self._add(self._position, 1)
        self._last[key] = self._position
        self._position += 1


def replay(records: Sequence[TraceRecord], shape: CacheShape, honour_max_load: bool = True) -> list[RequestReplay]:
    """The GPU hit of every request, and the CPU-tier stack distances of the chunks it would look up.

    A request stores only the chunks within its `max_offload_tokens` (none at 0, as offload admission sends for a
    prefix that has not returned). Approximation: a request that stores nothing does not refresh the chunks it
    loads either (the connector does touch them), so such traffic is modelled a little pessimistically."""
    gpu = GpuModel(shape.gpu_blocks)
    total_refs = sum(_chunk_count(r, shape) for r in records)
    cpu = StackDistances(total_refs)
    out: list[RequestReplay] = []
    for record in records:
        chain = record.fingerprint_list()
        weight = record.tokens_per_chunk / shape.block_size
        gpu_hit = gpu.request(chain, weight, record.prompt_tokens, record.completion_tokens, shape.block_size)
        per_chunk = _per_chunk(record, shape)
        keys = [chain[(i + 1) * per_chunk - 1] for i in range(len(chain) // per_chunk)]
        chunk_tokens = per_chunk * record.tokens_per_chunk
        start = int(gpu_hit // chunk_tokens)
        distances = [cpu.distance(key) for key in keys[start:]]
        limit = record.max_offload_tokens
        for key in keys if limit is None else keys[: int(limit // chunk_tokens)]:
            cpu.reference(key)
        out.append(RequestReplay(record.prompt_tokens, gpu_hit, distances, int(gpu_hit - start * chunk_tokens),
                                 chunk_tokens, chain[0] if chain else b"",
                                 record.max_load_tokens if honour_max_load else None))
    return out


def _per_chunk(record: TraceRecord, shape: CacheShape) -> int:
    return max(1, round(shape.offload_block_tokens / record.tokens_per_chunk))


def _chunk_count(record: TraceRecord, shape: CacheShape) -> int:
    return record.chunks // _per_chunk(record, shape)


def shares_at(replayed: Sequence[RequestReplay], cpu_chunks: int) -> TierShares:
    """Token totals when the CPU tier holds `cpu_chunks` chunks (0: no tier)."""
    result = TierShares(cpu_chunks)
    for request in replayed:
        loaded = _cpu_loaded(request, cpu_chunks)
        result.prompt_tokens += request.prompt_tokens
        result.gpu_tokens += request.gpu_hit
        result.cpu_tokens += loaded
        prompt, gpu_tokens, cpu_tokens = result.per_root.get(request.root, (0.0, 0.0, 0.0))
        result.per_root[request.root] = (prompt + request.prompt_tokens, gpu_tokens + request.gpu_hit,
                                         cpu_tokens + loaded)
    return result


def _cpu_loaded(request: RequestReplay, cpu_chunks: int) -> float:
    if cpu_chunks <= 0 or request.max_load == 0:
        return 0.0
    run = 0
    for distance in request.cpu_distances:
        if distance < 0 or distance >= cpu_chunks:
            break
        run += 1
    loaded = run * request.chunk_tokens - request.start_offset
    if request.max_load is not None:  # whole chunks within the cap, as the connector rounds it
        end = min(request.gpu_hit + loaded, request.gpu_hit + request.max_load)
        loaded = math.floor(end / request.chunk_tokens) * request.chunk_tokens - request.gpu_hit
    if loaded < request.chunk_tokens - 1e-9:
        return 0.0
    return min(loaded, float(request.prompt_tokens - request.gpu_hit))


def share_error_bound(shares: TierShares, rate: float) -> tuple[float, float]:
    """95 % half-widths of the GPU and CPU shares from SHARDS sampling (0 when nothing was sampled out).

    Roots are the sampling units, so this is the standard error of a ratio estimator over root clusters,
    with the finite-population correction sqrt(1 - rate).
    """
    clusters = list(shares.per_root.values())
    if rate >= 1.0 or len(clusters) < 2 or shares.prompt_tokens <= 0:
        return 0.0, 0.0
    return (_ratio_half_width(clusters, 1, shares.gpu_share, shares.prompt_tokens, rate),
            _ratio_half_width(clusters, 2, shares.cpu_share, shares.prompt_tokens, rate))


def _ratio_half_width(clusters: list[tuple[float, float, float]], column: int, share: float, total: float,
                      rate: float) -> float:
    n = len(clusters)
    residuals = sum((cluster[column] - share * cluster[0]) ** 2 for cluster in clusters)
    standard_error = math.sqrt(n / (n - 1) * residuals) / total * math.sqrt(max(0.0, 1 - rate))
    return 1.96 * standard_error
