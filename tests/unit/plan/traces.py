"""Hand-made reuse-trace records for the plan's unit tests: named 8-byte fingerprints, so a test reads as the
block sequence it replays ("doc:0", "doc:1", ...) and its oracle can be worked out on paper."""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.plan.kvsize import ServerCache
from gateway.reuse.record import TraceRecord

BLOCK = 16


def fingerprint(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()[:8]


def blocks(doc: str, count: int) -> list[str]:
    return [f"{doc}:{index}" for index in range(count)]


def rec(names: list[str], *, ts: float = 0.0, prompt: int | None = None, tenant: str = "acme", pool: str = "main",
        cached: int = 0, completion: int = 1, per_chunk: float = float(BLOCK), text: bool = False,
        rate: float = 1.0, max_offload: int | None = None, max_load: int | None = None) -> TraceRecord:
    """A record whose chain is the named fingerprints; its prompt defaults to exactly the blocks it names."""
    return TraceRecord(ts=ts, tenant=tenant, pool=pool, epoch=1,
                       prompt_tokens=prompt if prompt is not None else round(len(names) * per_chunk),
                       cached_tokens=cached, completion_tokens=completion, text=text, chunk_units=BLOCK,
                       tokens_per_chunk=per_chunk, rate=rate, chain=b"".join(fingerprint(n) for n in names),
                       max_offload_tokens=max_offload, max_load_tokens=max_load)


BPT = 1000  # KV bytes per token, one rank, of the hand-worked plans
ONE_BLOCK_GPU = ServerCache(block_size=BLOCK, num_gpu_blocks=1, kv_cache_size_tokens=BLOCK,
                            kv_cache_memory_bytes=BLOCK * BPT, offloading_backend="native", offloading_size_gib=None,
                            cache_dtype="auto")


def doc_twice(**fields: Any) -> list[TraceRecord]:
    """The hand trace of the plan tests: a 128-token document (8 blocks, 2 chunks of 64) sent twice, 1,800 s
    apart; with ONE_BLOCK_GPU the second hits 16 tokens on the GPU and a 2-chunk tier serves the other 112."""
    names = blocks("doc", 8)
    return [rec(names, ts=0.0, cached=0, **fields), rec(names, ts=1800.0, cached=16, **fields)]
