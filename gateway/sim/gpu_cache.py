"""The GPU prefix cache: a pool of N blocks, full blocks cached by hash, LRU eviction of unreferenced ones.

As in vLLM's block pool, a block stays cached after its request finishes (reference count 0) until its slot
is needed; a finished request's blocks are freed tail first, so the end of a prompt is evicted before its
beginning. Blocks without a hash (a prompt's partial last block) occupy slots while a request runs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class Acquired:
    """What one allocation took: cached hashes now referenced, anonymous slots, and evicted hashes."""

    held: list[int] = field(default_factory=list)
    anonymous: int = 0
    evicted: list[int] = field(default_factory=list)


class PrefixCache:
    """Reference-counted, hash-keyed block pool with an LRU queue of unreferenced cached blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._refs: dict[int, int] = {}
        self._free: OrderedDict[int, None] = OrderedDict()
        self._anonymous = 0

    @property
    def cached_blocks(self) -> int:
        return len(self._refs)

    @property
    def blocks_in_use(self) -> int:
        return len(self._refs) - len(self._free) + self._anonymous

    @property
    def usage(self) -> float:
        return self.blocks_in_use / self.num_blocks

    def contains(self, block: int) -> bool:
        return block in self._refs

    def match(self, hashes: Sequence[int]) -> int:
        """Number of leading hashes that are cached."""
        for count, block in enumerate(hashes):
            if block not in self._refs:
                return count
        return len(hashes)

    def acquire(self, hashes: Sequence[int], anonymous: int = 0) -> Acquired:
        """Reference (or cache) `hashes` in order, then take `anonymous` slots; stops when the pool is full."""
        taken = Acquired()
        for block in hashes:
            if block not in self._refs and not self._make_room(taken.evicted):
                break
            self._reference(block)
            taken.held.append(block)
        while taken.anonymous < anonymous and self._make_room(taken.evicted):
            self._anonymous += 1
            taken.anonymous += 1
        return taken

    def release(self, taken: Acquired) -> None:
        """Drop the references of one allocation; its blocks stay cached, last block first in line."""
        self._anonymous -= taken.anonymous
        for block in reversed(taken.held):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None

    def drop(self, blocks: Sequence[int]) -> list[int]:
        """Forget the unreferenced ones of `blocks` (their content is invalid); returns those forgotten."""
        dropped = [block for block in dict.fromkeys(blocks) if self._refs.get(block) == 0]  # once each
        for block in dropped:
            del self._refs[block]
            self._free.pop(block, None)
        return dropped

    def clear(self) -> bool:
        """Forget every cached block, as reset_prefix_cache does; refused while blocks are in use."""
        if self.blocks_in_use:
            return False
        self._refs.clear()
        self._free.clear()
        return True

    def _reference(self, block: int) -> None:
        count = self._refs.get(block, 0)
        if count == 0:
            self._free.pop(block, None)
        self._refs[block] = count + 1

    def _make_room(self, evicted: list[int]) -> bool:
        if len(self._refs) + self._anonymous < self.num_blocks:
            return True
        if not self._free:
            return False
        victim, _ = self._free.popitem(last=False)
        del self._refs[victim]
        evicted.append(victim)
        return True
