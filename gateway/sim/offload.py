"""The CPU offload tier (`--offload`), modelled on vLLM's OffloadingConnector with its CPU spec.

- Capacity: `cpu_bytes_to_use // (offload_block_size * kv_bytes_per_token)` chunks. The default model shape is
  the captured Qwen3-8B one, 147456 bytes of KV per token (`--kv-bytes-per-token` changes it).
- A chunk is `offload_block_size` tokens (64 = 4 GPU blocks of 16); its key is the hash of its last GPU block,
  so chunks inherit the salt and the prefix chain. LRU eviction.
- Lookup (on a GPU miss): consecutive stored chunks from the chunk holding the first token the GPU lacks;
  the tokens beyond the GPU hit are loaded, unless fewer than one chunk's worth (vLLM then loads nothing).
  `max_load_tokens` caps them (rounded down to whole chunks; 0 disables loading).
- Store (after prefill): the prompt's full chunks not yet stored; `max_offload_tokens` limits them to chunks
  within the first N tokens (0 disables storing). Only prompt tokens are offloaded.
- Events: see kv_events; removals of one store are one `BlockRemoved` event. `reset_prefix_cache` with
  `reset_external=true` empties the tier without events, as vLLM does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from gateway.sim import kv_events
from gateway.sim.config import SimConfig
from gateway.sim.kv_events import Event
from gateway.sim.metrics import OffloadMetrics


class CpuTier:
    """LRU store of chunks: key (last block hash) -> the chunk's GPU block hashes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._chunks: OrderedDict[int, tuple[int, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._chunks)

    def __contains__(self, key: int) -> bool:
        return key in self._chunks

    def leading_hits(self, keys: Sequence[int]) -> int:
        for count, key in enumerate(keys):
            if key not in self._chunks:
                return count
        return len(keys)

    def touch(self, keys: Sequence[int]) -> None:
        for key in keys:
            self._chunks.move_to_end(key)

    def insert(self, key: int, blocks: tuple[int, ...], protected: set[int]) -> list[tuple[int, ...]] | None:
        """Store one chunk, evicting LRU chunks outside `protected`; None when there is no room."""
        evicted: list[tuple[int, ...]] = []
        while len(self._chunks) >= self.capacity:
            victim = next((k for k in self._chunks if k not in protected), None)
            if victim is None:
                return None
            evicted.append(self._chunks.pop(victim))
        self._chunks[key] = blocks
        return evicted

    def remove(self, key: int) -> tuple[int, ...] | None:
        return self._chunks.pop(key, None)

    def clear(self) -> None:
        self._chunks.clear()


class OffloadConnector:
    """Decides loads and stores for requests and reports them as metrics and KV events."""

    def __init__(self, config: SimConfig, metrics: OffloadMetrics, events_enabled: bool) -> None:
        self.tier = CpuTier(config.cpu_chunks)
        self._chunk = config.offload_block_size
        self._per_chunk = config.blocks_per_chunk
        self._block_size = config.block_size
        self._bytes_per_token = config.kv_bytes_per_token
        self._us_per_token = config.load_us_per_token
        self._self_describing = config.self_describing_kv_events
        self._metrics = metrics
        self._events = events_enabled

    def chunk_keys(self, hashes: Sequence[int]) -> list[int]:
        """The key of every full chunk: the hash of its last GPU block."""
        return [hashes[(i + 1) * self._per_chunk - 1] for i in range(len(hashes) // self._per_chunk)]

    def hit_tokens(self, hashes: Sequence[int], gpu_hit: int, max_load: int | None) -> int:
        """Prompt tokens beyond the GPU hit that the CPU tier can supply."""
        if max_load == 0:
            return 0
        start = gpu_hit // self._chunk
        end = (start + self.tier.leading_hits(self.chunk_keys(hashes)[start:])) * self._chunk
        if max_load is not None:
            end = min(end, gpu_hit + max_load) // self._chunk * self._chunk
        loaded = end - gpu_hit
        return loaded if loaded >= self._chunk else 0

    def load(self, hashes: Sequence[int], gpu_hit: int, loaded: int) -> None:
        """Account a load of `loaded` tokens after `gpu_hit` (touching the chunks read)."""
        keys = self.chunk_keys(hashes)[gpu_hit // self._chunk : (gpu_hit + loaded) // self._chunk]
        self.tier.touch(keys)
        self._metrics.observe("load", loaded * self._bytes_per_token, loaded * self._us_per_token / 1e6)

    def discard(self, hashes: Sequence[int], gpu_hit: int, loaded: int) -> list[Event]:
        """Remove the chunks of a failed load; returns their removal event (an assumption: not captured)."""
        keys = self.chunk_keys(hashes)[gpu_hit // self._chunk : (gpu_hit + loaded) // self._chunk]
        removed = [blocks for blocks in (self.tier.remove(key) for key in keys) if blocks is not None]
        return self._removed_events(removed) if self._events else []

    def store(self, prompt: Sequence[int], hashes: Sequence[int], max_offload: int | None) -> list[Event]:
        """Offload the prompt's eligible chunks; returns the KV events of this store."""
        limit = len(prompt) if max_offload is None else min(len(prompt), max_offload)
        keys = self.chunk_keys(hashes)[: limit // self._chunk]
        stored, evicted = self._insert_all(keys, hashes)
        if stored:
            tokens = len(stored) * self._chunk
            self._metrics.observe("store", tokens * self._bytes_per_token, tokens * self._us_per_token / 1e6)
        if not self._events:
            return []
        return self._removed_events(evicted) + [self._stored_event(i, prompt, hashes) for i in stored]

    def _insert_all(self, keys: list[int], hashes: Sequence[int]) -> tuple[list[int], list[tuple[int, ...]]]:
        protected = set(keys)
        stored: list[int] = []
        evicted: list[tuple[int, ...]] = []
        for index, key in enumerate(keys):
            if key in self.tier:
                self.tier.touch((key,))
                continue
            dropped = self.tier.insert(key, self._blocks(index, hashes), protected)
            if dropped is None:
                break
            evicted.extend(dropped)
            stored.append(index)
        return stored, evicted

    def _blocks(self, index: int, hashes: Sequence[int]) -> tuple[int, ...]:
        return tuple(hashes[index * self._per_chunk : (index + 1) * self._per_chunk])

    def _removed_events(self, evicted: list[tuple[int, ...]]) -> list[Event]:
        if not evicted:
            return []
        hashes = [h for blocks in evicted for h in (blocks if self._self_describing else blocks[-1:])]
        return [kv_events.removed(hashes, "CPU")]

    def _stored_event(self, index: int, prompt: Sequence[int], hashes: Sequence[int]) -> Event:
        blocks = self._blocks(index, hashes)
        if not self._self_describing:
            return kv_events.cpu_placeholder(blocks[-1])
        first = index * self._per_chunk
        parent = hashes[first - 1] if first else None
        tokens = prompt[index * self._chunk : (index + 1) * self._chunk]
        return kv_events.cpu_self_describing(blocks, parent, tokens, self._block_size)
