"""The CPU offload tier (pure): chunk keys, the load rule and its caps, stores and LRU eviction, and the KV events
and Prometheus samples they produce. 16-token GPU blocks, 64-token chunks (4 blocks), 147,456 KV bytes per token
(the captured Qwen3-8B shape), so one chunk is 9,437,184 bytes. Block hashes are opaque to the tier: the tests use
101, 102, ... so a chunk's key (its last block's hash) can be read off by hand."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from gateway.sim.config import SimConfig
from gateway.sim.metrics import OffloadMetrics
from gateway.sim.offload import CpuTier, OffloadConnector

BYTES_PER_TOKEN = 147456
LABELS = {"model_name": "sim-model", "engine": "0"}
PROMPT = list(range(3, 3 + 256))  # four full chunks
HASHES = list(range(101, 117))  # sixteen GPU blocks: chunk keys 104, 108, 112, 116


class Tier:
    """One connector with its own registry (real prometheus_client families)."""

    def __init__(self, chunks: int, events: bool = True, self_describing: bool = False) -> None:
        config = SimConfig(offload=True, cpu_bytes_to_use=chunks * 64 * BYTES_PER_TOKEN,
                           self_describing_kv_events=self_describing)
        self.registry = CollectorRegistry()
        self.connector = OffloadConnector(config, OffloadMetrics(self.registry, ("sim-model", "0")), events)

    def sample(self, name: str, transfer: str | None = None) -> float:
        labels = dict(LABELS) if transfer is None else {**LABELS, "transfer_type": transfer}
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


def test_cpu_tier_lru_insert_touch_and_remove() -> None:
    tier = CpuTier(2)
    assert tier.insert(1, (10, 1), set()) == []
    assert tier.insert(2, (20, 2), set()) == []
    tier.touch([1])
    assert tier.insert(3, (30, 3), set()) == [(20, 2)]  # 2 was least recently used
    assert (len(tier), 1 in tier, 2 in tier) == (2, True, False)
    assert tier.remove(1) == (10, 1)
    assert tier.remove(1) is None
    tier.clear()
    assert len(tier) == 0


def test_cpu_tier_never_evicts_a_protected_chunk() -> None:
    tier = CpuTier(2)
    tier.insert(1, (1,), set())
    tier.insert(2, (2,), set())
    assert tier.insert(3, (3,), {1, 2}) is None  # nothing may go: no room
    assert tier.insert(3, (3,), {1}) == [(2,)]
    assert tier.leading_hits([1, 3, 2]) == 2
    assert tier.leading_hits([]) == 0
    assert tier.leading_hits([2, 1]) == 0


def test_a_tier_of_zero_chunks_stores_nothing() -> None:
    tier = CpuTier(0)
    assert tier.insert(1, (1,), set()) is None
    assert len(tier) == 0


@pytest.mark.parametrize(
    ("hashes", "keys"),
    [([], []), (HASHES[:3], []), (HASHES[:4], [104]), (HASHES[:15], [104, 108, 112]), (HASHES, [104, 108, 112, 116])],
)
def test_a_chunk_key_is_the_hash_of_its_last_block(hashes: list[int], keys: list[int]) -> None:
    assert Tier(8).connector.chunk_keys(hashes) == keys


@pytest.mark.parametrize(
    ("gpu_hit", "max_load", "loaded"),
    [
        (0, None, 256),  # the whole prompt, as vLLM 0.25.0 reported 8000 of 8000 (steps.json)
        (64, None, 192),
        (96, None, 160),  # a GPU hit inside a chunk: from that chunk's end
        (192, None, 64),
        (240, None, 0),  # 16 tokens beyond the GPU hit: less than a chunk, vLLM loads nothing
        (256, None, 0),
        (0, 0, 0),  # max_load_tokens 0 disables loading
        (0, 63, 0),  # rounded down to whole chunks: nothing
        (0, 64, 64),
        (0, 100, 64),
        (0, 10_000, 256),
        (96, 128, 96),  # the end (96 + 128 = 224) is rounded down to a chunk boundary (192)
        (96, 50, 0),  # 146 rounds down to 128: 32 tokens, less than a chunk
    ],
)
def test_hit_tokens_beyond_the_gpu_hit(gpu_hit: int, max_load: int | None, loaded: int) -> None:
    tier = Tier(8)
    tier.connector.store(PROMPT, HASHES, None)
    assert tier.connector.hit_tokens(HASHES, gpu_hit, max_load) == loaded


@pytest.mark.parametrize(("gpu_hit", "loaded"), [(0, 128), (64, 64), (100, 0), (128, 0)])
def test_hit_tokens_count_consecutive_stored_chunks_only(gpu_hit: int, loaded: int) -> None:
    tier = Tier(8)
    tier.connector.store(PROMPT, HASHES, 128)  # chunks 0 and 1
    assert tier.connector.hit_tokens(HASHES, gpu_hit, None) == loaded


def test_a_missing_first_chunk_hides_the_later_ones_unless_the_gpu_has_it() -> None:
    tier = Tier(8)
    tier.connector.store(PROMPT, HASHES, None)
    tier.connector.tier.remove(104)
    assert tier.connector.hit_tokens(HASHES, 0, None) == 0
    assert tier.connector.hit_tokens(HASHES, 64, None) == 192


def test_a_store_sends_one_placeholder_per_new_chunk_and_counts_its_bytes() -> None:
    tier = Tier(8)
    events = tier.connector.store(PROMPT, HASHES, None)
    assert [e["block_hashes"] for e in events] == [[104], [108], [112], [116]]
    assert all(e["medium"] == "CPU" and e["block_size"] == 0 and e["token_ids"] == [] for e in events)
    assert tier.sample("vllm:kv_offload_total_bytes_total", "GPU_to_CPU") == 256 * BYTES_PER_TOKEN
    assert tier.sample("vllm:kv_offload_store_bytes_total") == 256 * BYTES_PER_TOKEN
    assert tier.sample("vllm:kv_offload_size_count", "GPU_to_CPU") == 1.0  # one transfer for the whole store
    assert tier.sample("vllm:kv_offload_total_time_total", "GPU_to_CPU") == pytest.approx(256 * 4e-6)
    assert tier.sample("vllm:kv_offload_total_bytes_total", "CPU_to_GPU") == 0.0


def test_storing_the_same_prompt_again_sends_and_counts_nothing() -> None:
    tier = Tier(8)
    tier.connector.store(PROMPT, HASHES, None)
    assert tier.connector.store(PROMPT, HASHES, None) == []
    assert tier.sample("vllm:kv_offload_size_count", "GPU_to_CPU") == 1.0
    assert len(tier.connector.tier) == 4


@pytest.mark.parametrize(
    ("prompt_len", "max_offload", "keys"),
    [
        (256, 0, []),  # 0 disables storing
        (256, 63, []),
        (256, 64, [104]),
        (256, 100, [104]),
        (256, 4096, [104, 108, 112, 116]),  # a cap beyond the prompt stores the prompt's chunks
        (200, None, [104, 108, 112]),  # a partial last chunk is never stored
        (63, None, []),
    ],
)
def test_max_offload_tokens_limits_the_stored_chunks(prompt_len: int, max_offload: int | None,
                                                     keys: list[int]) -> None:
    tier = Tier(8)
    prompt, hashes = PROMPT[:prompt_len], HASHES[: prompt_len // 16]
    events = tier.connector.store(prompt, hashes, max_offload)
    assert [h for e in events for h in e["block_hashes"]] == keys
    assert tier.sample("vllm:kv_offload_store_bytes_total") == len(keys) * 64 * BYTES_PER_TOKEN


def test_self_describing_events_carry_the_chunk_blocks_parent_and_tokens() -> None:
    tier = Tier(8, self_describing=True)
    first, second = tier.connector.store(PROMPT[:128], HASHES[:8], None)
    assert (first["block_hashes"], first["parent_block_hash"], first["token_ids"]) == (
        [101, 102, 103, 104], None, PROMPT[:64])
    assert (second["block_hashes"], second["parent_block_hash"], second["token_ids"]) == (
        [105, 106, 107, 108], 104, PROMPT[64:128])
    assert first["block_size"] == second["block_size"] == 16


def test_eviction_of_a_store_is_one_removal_event_before_its_stores() -> None:
    tier = Tier(4)
    tier.connector.store(PROMPT, HASHES, None)
    other = list(range(201, 209))  # a second prompt of two chunks: keys 204, 208
    events = tier.connector.store(PROMPT[:128], other, None)
    assert events[0] == {"type": "BlockRemoved", "block_hashes": [104, 108], "medium": "CPU", "group_idx": 0}
    assert [e["block_hashes"] for e in events[1:]] == [[204], [208]]
    assert [k in tier.connector.tier for k in (104, 108, 112, 116, 204, 208)] == [False, False, True, True, True,
                                                                                  True]


def test_a_self_describing_removal_names_every_block_of_the_evicted_chunks() -> None:
    tier = Tier(1, self_describing=True)
    tier.connector.store(PROMPT[:64], HASHES[:4], None)
    removal, stored = tier.connector.store(PROMPT[:64], [201, 202, 203, 204], None)
    assert removal["block_hashes"] == [101, 102, 103, 104]
    assert stored["block_hashes"] == [201, 202, 203, 204]


def test_a_store_larger_than_the_tier_never_evicts_its_own_chunks() -> None:
    tier = Tier(2)
    events = tier.connector.store(PROMPT, HASHES, None)
    assert [e["block_hashes"] for e in events] == [[104], [108]]  # no room for chunks 2 and 3, no removal
    assert tier.sample("vllm:kv_offload_store_bytes_total") == 128 * BYTES_PER_TOKEN


def test_a_load_touches_the_chunks_it_read() -> None:
    tier = Tier(3)
    tier.connector.store(PROMPT[:128], HASHES[:8], None)  # 104, 108
    tier.connector.store(PROMPT[:64], [301, 302, 303, 304], None)  # 304; LRU order now 104, 108, 304
    tier.connector.load(HASHES[:8], 0, 64)  # reads 104: order 108, 304, 104
    events = tier.connector.store(PROMPT[:64], [401, 402, 403, 404], None)
    assert events[0]["block_hashes"] == [108]
    assert tier.sample("vllm:kv_offload_load_bytes_total") == 64 * BYTES_PER_TOKEN
    assert tier.sample("vllm:kv_offload_total_bytes_total", "CPU_to_GPU") == 64 * BYTES_PER_TOKEN


def test_discard_removes_the_chunks_of_a_failed_load() -> None:
    tier = Tier(8)
    tier.connector.store(PROMPT, HASHES, None)
    assert tier.connector.discard(HASHES, 64, 128) == [
        {"type": "BlockRemoved", "block_hashes": [108, 112], "medium": "CPU", "group_idx": 0}]
    assert [k in tier.connector.tier for k in (104, 108, 112, 116)] == [True, False, False, True]
    assert tier.connector.discard(HASHES, 64, 128) == []  # already gone: nothing to announce


def test_without_events_the_tier_still_stores_and_counts() -> None:
    tier = Tier(1, events=False)
    assert tier.connector.store(PROMPT[:64], HASHES[:4], None) == []
    assert tier.connector.store(PROMPT[:64], [201, 202, 203, 204], None) == []  # evicts silently
    assert tier.connector.discard([201, 202, 203, 204], 0, 64) == []
    assert tier.sample("vllm:kv_offload_store_bytes_total") == 128 * BYTES_PER_TOKEN
    assert len(tier.connector.tier) == 0


def test_capacity_comes_from_the_byte_budget() -> None:
    assert SimConfig(offload=True).cpu_chunks == 12_000_000_000 // (64 * BYTES_PER_TOKEN) == 1271
    assert SimConfig(offload=True, cpu_bytes_to_use=64 * BYTES_PER_TOKEN - 1).cpu_chunks == 0
    assert SimConfig(offload=False).cpu_chunks == 0
    assert Tier(5).connector.tier.capacity == 5
