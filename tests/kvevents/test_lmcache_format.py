"""The lmcache KV-event format on hand-built vLLM-framed payloads: medium names map onto the policy
vocabulary, a chunk is owned by the GPU chain that held the same tokens, and two owners of one chunk hash
get two hashes."""

from __future__ import annotations

from typing import Any

import msgspec

from gateway.kvevents.formats.base import decoder_for
from gateway.kvevents.formats.lmcache import lmcache_medium
from gateway.kvevents.wire import BlockRemoved, BlockStored

BLOCK, CHUNK = 4, 8


def gpu_chain(first_hash: int, tokens: list[int], salt: str) -> dict[str, Any]:
    blocks = len(tokens) // BLOCK
    return {"type": "BlockStored", "block_hashes": [first_hash + i for i in range(blocks)], "parent_block_hash": None,
            "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None,
            "extra_keys": [[salt]] + [None] * (blocks - 1)}


def chunk(chunk_hash: int, parent: int | None, tokens: list[int], medium: str = "cpu") -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [chunk_hash], "parent_block_hash": parent, "token_ids": tokens,
            "block_size": CHUNK, "lora_id": None, "medium": medium}


def payload(*events: dict[str, Any]) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events), None])


def stored(events: list[Any]) -> list[BlockStored]:
    return [event for event in events if isinstance(event, BlockStored)]


def test_chunks_take_the_owner_of_the_gpu_chain_with_the_same_tokens() -> None:
    tokens = list(range(16))
    decoder = decoder_for("lmcache")
    batch = decoder.decode(payload(gpu_chain(100, tokens, "salt-a"), chunk(7, None, tokens[:8]),
                                   chunk(8, 7, tokens[8:])))
    chunks = stored(batch.events)[1:]
    assert [event.extra_keys for event in chunks] == [[["salt-a"]], [["salt-a"]]]
    assert [event.medium for event in chunks] == ["CPU", "CPU"]
    later = decoder.decode(payload(gpu_chain(200, tokens, "salt-b"), chunk(7, None, tokens[:8])))
    again = stored(later.events)[-1]
    assert again.extra_keys == [["salt-b"]] and again.block_hashes != chunks[0].block_hashes


def test_a_chunk_no_gpu_chain_held_stays_unattributed() -> None:
    batch = decoder_for("lmcache").decode(payload(chunk(9, None, [5] * 8, "LocalDiskBackend")))
    (event,) = stored(batch.events)
    assert (event.block_hashes, event.extra_keys, event.medium) == ([9], None, "DISK")


def test_medium_names() -> None:
    assert [lmcache_medium(name) for name in ("cpu", "LocalCPUBackend", "gds", "redis", "mooncake", None)] == [
        "CPU", "CPU", "DISK", "REMOTE", "REMOTE", "CPU"]
    assert lmcache_medium("SomeNewBackend") == "SOMENEWBACKEND"  # unknown: never silently allowed


def test_the_vllm_format_keeps_lmcache_names_raw() -> None:
    batch = decoder_for("vllm").decode(payload(chunk(9, None, [5] * 8, "cpu")))
    assert stored(batch.events)[0].medium == "cpu"


def test_multi_process_cpu_events_are_chunks_and_a_removal_closes_every_owner() -> None:
    tokens = list(range(8))
    decoder = decoder_for("lmcache")
    decoder.decode(payload(gpu_chain(100, tokens, "salt-a"), chunk(7, None, tokens, "CPU")))
    batch = decoder.decode(payload(gpu_chain(200, tokens, "salt-b"), chunk(7, None, tokens, "CPU")))
    owners = stored(batch.events)[-1]
    assert owners.extra_keys == [["salt-b"]] and owners.medium == "CPU"
    removal = decoder.decode(payload({"type": "BlockRemoved", "block_hashes": [7], "medium": "CPU"})).events[0]
    assert isinstance(removal, BlockRemoved)
    assert removal.medium == "CPU" and len(removal.block_hashes) == 2 and 7 not in removal.block_hashes


def test_a_chunk_with_parent_zero_is_placed_by_its_first_block() -> None:
    tokens = list(range(16))
    decoder = decoder_for("lmcache")
    batch = decoder.decode(payload(gpu_chain(100, tokens, "salt-a"), chunk(8, 0, tokens[8:])))
    event = stored(batch.events)[-1]
    assert event.extra_keys == [["salt-a"]]  # LMCache skipped the saved first chunk and named parent 0
