"""Which tenant a stored block belongs to. Pure.

A chain's root block (no parent) carries the `cache_salt` among its extra keys; its descendants inherit
through `parent_block_hash`. Offload-tier placeholders carry the hash of a GPU block, so they inherit from
that block; self-describing offload events carry their own chain. Lookups ask the ledger's own resident
blocks first, then a bounded least-recently-used cache of hashes seen before. Nothing else is guessed: a
block that cannot be traced to an issued salt is `unattributed`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from gateway.kvevents.wire import BlockStored, HashValue
from gateway.ledger.records import UNATTRIBUTED, Attribution
from gateway.ledger.salts import SaltIndex

DEFAULT_CAPACITY = 1_000_000
Lookup = Callable[[HashValue | None], Attribution | None]


class KnownHashes:
    """Bounded hash -> attribution memory, least recently used first out (hashes of a salted chain never
    change owner, so an entry is never wrong, only possibly forgotten)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self.capacity = capacity
        self._map: OrderedDict[HashValue, Attribution] = OrderedDict()

    def get(self, block_hash: HashValue | None) -> Attribution | None:
        if block_hash is None:
            return None
        found = self._map.get(block_hash)
        if found is not None:
            self._map.move_to_end(block_hash)
        return found

    def put(self, block_hash: HashValue, attribution: Attribution) -> None:
        self._map[block_hash] = attribution
        self._map.move_to_end(block_hash)
        if len(self._map) > self.capacity:
            self._map.popitem(last=False)

    def __len__(self) -> int:
        return len(self._map)


def attribute_event(
    event: BlockStored, salts: SaltIndex, known: KnownHashes, resident: Lookup | None = None,
) -> list[Attribution]:
    """One attribution per block hash of the event, in order; remembers the attributed ones."""

    def lookup(block_hash: HashValue | None) -> Attribution | None:
        return (resident(block_hash) if resident is not None else None) or known.get(block_hash)

    chain = _chain_owner(event, salts, lookup)
    if chain is not None:
        owners = [chain] * len(event.block_hashes)
    else:
        owners = [lookup(block_hash) or UNATTRIBUTED for block_hash in event.block_hashes]
    for block_hash, owner in zip(event.block_hashes, owners, strict=True):
        if owner is not UNATTRIBUTED:
            known.put(block_hash, owner)
    return owners


def _chain_owner(event: BlockStored, salts: SaltIndex, lookup: Lookup) -> Attribution | None:
    """The owner shared by every block of a chain-shaped event, or None when blocks must be looked up one
    by one (a root without a matching salt, e.g. offload placeholders that name unrelated chunks)."""
    if not event.block_hashes:
        return None
    if event.parent_block_hash is not None:
        return lookup(event.block_hashes[0]) or lookup(event.parent_block_hash) or UNATTRIBUTED
    root_keys = event.extra_keys[0] if event.extra_keys else None
    return salts.match(root_keys)
