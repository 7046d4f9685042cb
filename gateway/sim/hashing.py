"""Prefix-cache block hashes: chained, salted, 64-bit unsigned, reproducible across processes.

Like vLLM, the hash of block i covers the hash of block i-1 (a fixed root value for block 0), the block's token
ids and its extra keys; the `cache_salt` is an extra key of the root block only, so a salt changes every hash
of the chain. The digest is SHA-256 and the exposed hash is its low 64 bits read big-endian (vLLM's integer
block hashes). The exact byte serialisation is the simulator's own, so values differ from a real server's.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

ROOT_PARENT = int.from_bytes(hashlib.sha256(b"kvgate-sim-none-hash").digest()[-8:], "big")


def block_hash(parent: int, tokens: Sequence[int], salt: str | None) -> int:
    """Hash of one full block given its parent's hash."""
    digest = hashlib.sha256(parent.to_bytes(8, "big"))
    digest.update(struct.pack(f"<{len(tokens)}I", *tokens))
    digest.update(b"\x01" + salt.encode() if salt else b"\x00")
    return int.from_bytes(digest.digest()[-8:], "big")


def chain_hashes(
    tokens: Sequence[int], block_size: int, salt: str | None, start_block: int = 0, parent: int | None = None
) -> list[int]:
    """Hashes of the full blocks of `tokens` from block index `start_block` on.

    `parent` is the hash of block `start_block - 1` (ignored for block 0, which gets the salt).
    """
    hashes: list[int] = []
    previous = ROOT_PARENT if start_block == 0 or parent is None else parent
    for index in range(start_block, len(tokens) // block_size):
        block = tokens[index * block_size : (index + 1) * block_size]
        previous = block_hash(previous, block, salt if index == 0 else None)
        hashes.append(previous)
    return hashes
