"""LMCache's chunks as a real vLLM 0.25.0 + LMCache 0.5.6 server published them (H200, 2026-12-01), decoded and
attributed to the tenant whose GPU chain computed the same tokens.

The expected owner of each chunk is found here without the decoder: by laying the chunk's token ids over the
token ids of the GPU events in the capture, and reading that GPU chain's root extra key (the salt vLLM hashed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from gateway.kvevents.formats.lmcache import LMCacheDecoder
from gateway.kvevents.wire import BlockStored

CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "kv-events"
CAPTURE = CAPTURES / "lmcache_kv_events.sample.jsonl"


def payloads() -> list[bytes]:
    return [bytes.fromhex(json.loads(line)["frames_hex"][-1]) for line in CAPTURE.read_text().splitlines()]


def raw_events(payload: bytes) -> list[dict[str, Any]]:
    batch = msgspec.msgpack.decode(payload)
    events: list[dict[str, Any]] = batch[1]
    return events


def expected_owners() -> list[list[object]]:
    """Per LMCache chunk, in stream order: the root extra key of the GPU chain holding the same tokens."""
    gpu_chains: list[tuple[list[int], object]] = []
    owners: list[list[object]] = []
    for payload in payloads():
        for event in raw_events(payload):
            if event["type"] != "BlockStored":
                continue
            if event["medium"] == "GPU":
                gpu_chains.append((event["token_ids"], event["extra_keys"][0]))
                continue
            size = event["block_size"]
            own = event["token_ids"][:size]
            found = [root for tokens, root in gpu_chains
                     for start in range(0, len(tokens) - size + 1, size) if tokens[start:start + size] == own]
            owners.append(found)
    return owners


def test_the_capture_has_the_shape_vllm_0_25_relays() -> None:
    chunks = [event for payload in payloads() for event in raw_events(payload)
              if event["type"] == "BlockStored" and event["medium"] == "cpu"]
    assert len(chunks) == 4 * 31  # four 8000-token prompts, 31 whole 256-token chunks each
    sizes = [len(event["token_ids"]) for event in chunks]
    assert set(sizes) == {256, 257} and sizes.count(257) > sizes.count(256)  # mostly block_size + 1
    assert {event["block_size"] for event in chunks} == {256}


def test_every_chunk_is_attributed_to_the_gpu_chain_that_computed_its_tokens() -> None:
    decoder = LMCacheDecoder()
    attributed: list[object] = []
    for payload in payloads():
        for event in decoder.decode(payload).events:
            if isinstance(event, BlockStored) and event.medium == "CPU":
                attributed.append(event.extra_keys[0] if event.extra_keys else None)
    owners = expected_owners()
    assert len(attributed) == len(owners) == 124
    assert all(len(set(map(str, found))) == 1 for found in owners)  # each chunk's tokens had exactly one owner
    assert attributed == [found[0] for found in owners]
    assert len({str(root) for root in attributed}) == 3  # acme (twice), then two other identities
