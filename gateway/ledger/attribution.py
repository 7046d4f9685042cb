"""Which tenant a stored block belongs to. Pure.

A chain's root block (no parent) carries the `cache_salt` among its extra keys; its descendants inherit
through `parent_block_hash`. Offload-tier placeholders carry the hash of a GPU block, so they inherit from
that block; self-describing offload events carry their own chain. Nothing else is guessed: a block that
cannot be traced to an issued salt is `unattributed`.
"""

from __future__ import annotations

from gateway.kvevents.wire import BlockStored, HashValue
from gateway.ledger.records import UNATTRIBUTED, Attribution
from gateway.ledger.salts import SaltIndex

DEFAULT_CAPACITY = 1_000_000


class KnownHashes:
    """Bounded hash -> attribution memory; the oldest entries go first (hashes of a salted chain never
    change owner, so an entry is never wrong, only possibly forgotten)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._map: dict[HashValue, Attribution] = {}

    def get(self, block_hash: HashValue | None) -> Attribution | None:
        return None if block_hash is None else self._map.get(block_hash)

    def put(self, block_hash: HashValue, attribution: Attribution) -> None:
        self._map[block_hash] = attribution
        if len(self._map) > self.capacity:
            del self._map[next(iter(self._map))]

    def __len__(self) -> int:
        return len(self._map)


def attribute_event(event: BlockStored, salts: SaltIndex, known: KnownHashes) -> list[Attribution]:
    """One attribution per block hash of the event, in order; remembers the attributed ones."""
    chain = _chain_owner(event, salts, known)
    if chain is not None:
        owners = [chain] * len(event.block_hashes)
    else:
        owners = [known.get(block_hash) or UNATTRIBUTED for block_hash in event.block_hashes]
    for block_hash, owner in zip(event.block_hashes, owners, strict=True):
        if owner is not UNATTRIBUTED:
            known.put(block_hash, owner)
    return owners


def _chain_owner(event: BlockStored, salts: SaltIndex, known: KnownHashes) -> Attribution | None:
    """The owner shared by every block of a chain-shaped event, or None when blocks must be looked up one
    by one (a root without a matching salt, e.g. offload placeholders that name unrelated chunks)."""
    if not event.block_hashes:
        return None
    if event.parent_block_hash is not None:
        return known.get(event.block_hashes[0]) or known.get(event.parent_block_hash) or UNATTRIBUTED
    root_keys = event.extra_keys[0] if event.extra_keys else None
    return salts.match(root_keys)
