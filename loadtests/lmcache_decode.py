"""Decoding cost of the ledger's two KV-event formats on an LMCache pool's stream. Not a test.

One batch = one 8000-token prefill as vLLM 0.25.0 + LMCache publish it: a 500-block GPU BlockStored with its
token ids and the salt on the root, then 31 LMCache chunk events (256 tokens each, lower-case medium). The
`vllm` decoder reads only hashes, parents and media; the `lmcache` decoder also reads token ids, keeps a
rolling prefix hash per GPU block and attributes each chunk. Reports CPU time per batch and per event.
Run: .venv/bin/python loadtests/lmcache_decode.py [--batches N] [--rounds R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

import msgspec

from gateway.kvevents.formats.base import decoder_for

TOKENS, BLOCK, CHUNK = 8000, 16, 256


def batch(rng: random.Random, salt: str, first_hash: int) -> bytes:
    tokens = [rng.randrange(100, 31000) for _ in range(TOKENS)]
    blocks = TOKENS // BLOCK
    events: list[dict[str, Any]] = [{
        "type": "BlockStored", "block_hashes": list(range(first_hash, first_hash + blocks)),
        "parent_block_hash": None, "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
        "lora_name": None, "extra_keys": [[salt]] + [None] * (blocks - 1)}]
    for index in range(TOKENS // CHUNK):
        events.append({"type": "BlockStored", "block_hashes": [first_hash * 7 + index],
                       "parent_block_hash": first_hash * 7 + index - 1 if index else None,
                       "token_ids": tokens[index * CHUNK : (index + 1) * CHUNK], "block_size": CHUNK,
                       "lora_id": None, "medium": "cpu", "lora_name": None})
    return msgspec.msgpack.encode([time.time(), events, None])


def measure(name: str, payloads: list[bytes]) -> float:
    decoder = decoder_for(name)
    started = time.process_time()
    for payload in payloads:
        decoder.decode(payload)
    return (time.process_time() - started) / len(payloads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(0)
    payloads = [batch(rng, f"salt-{i % 3}", 10_000 * (i + 1)) for i in range(args.batches)]
    events = 1 + TOKENS // CHUNK
    for name in ("vllm", "lmcache"):
        per_batch = [measure(name, payloads) for _ in range(args.rounds)]
        median = statistics.median(per_batch)
        print(f"{name:8s} median {median * 1e3:7.3f} ms/batch  {median * 1e6 / events:8.1f} us/event  "
              f"(rounds: {', '.join(f'{value * 1e3:.3f}' for value in per_batch)} ms)")


if __name__ == "__main__":
    main()
