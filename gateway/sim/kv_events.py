"""KV-cache events as vLLM encodes them: msgpack maps tagged by `"type"`, in vLLM's field order.

- GPU `BlockStored`: every field through `lora_name` (always present, even when null), then `extra_keys` (one
  entry per block: `[cache_salt]` on the chain's root block, else null), `group_idx`, `kv_cache_spec_kind`.
- CPU `BlockStored`, default: one placeholder per offloaded chunk (hash = the chunk's last GPU block hash,
  parent null, no tokens, block_size 0, no `extra_keys`, no `kv_cache_spec_kind`).
- CPU `BlockStored`, self-describing: the chunk's GPU block hashes, parent, token ids, block_size and
  `kv_cache_spec_kind`, still without `extra_keys` (so no salt on CPU events).
- `BlockRemoved`: `block_hashes`, `medium`, `group_idx` (GPU: one hash per event; CPU: one event per eviction
  batch). `AllBlocksCleared` has no fields, not even `medium`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

Event = dict[str, Any]
SPEC_KIND = "full_attention"


class EventSink(Protocol):
    """Where the engine hands batches of events (one batch per simulated engine step)."""

    @property
    def enabled(self) -> bool: ...

    def publish(self, events: list[Event], owner: str | None = None) -> None:
        """`owner`: the cache salt of the request whose step made the events (for the truth seam)."""
        ...


class NullSink:
    """KV events disabled: nothing is built or sent."""

    @property
    def enabled(self) -> bool:
        return False

    def publish(self, events: list[Event], owner: str | None = None) -> None:
        return None


def _stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], block_size: int,
            medium: str) -> Event:
    return {
        "type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
        "token_ids": list(tokens), "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None,
    }


def gpu_stored(hashes: Sequence[int], parent: int | None, tokens: Sequence[int], block_size: int,
               salt: str | None) -> Event:
    """GPU blocks newly cached by one request step; `parent` None means the first hash is the chain root."""
    event = _stored(hashes, parent, tokens, block_size, "GPU")
    root_keys = [salt] if salt and parent is None else None
    event["extra_keys"] = [root_keys] + [None] * (len(hashes) - 1)
    event["group_idx"] = 0
    event["kv_cache_spec_kind"] = SPEC_KIND
    return event


def gpu_removed(block: int) -> Event:
    return removed([block], "GPU")


def removed(hashes: Sequence[int], medium: str) -> Event:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, "group_idx": 0}


def all_cleared() -> Event:
    return {"type": "AllBlocksCleared"}


def cpu_placeholder(chunk_key: int) -> Event:
    event = _stored([chunk_key], None, [], 0, "CPU")
    event["group_idx"] = 0
    return event


def cpu_self_describing(hashes: Sequence[int], parent: int | None, tokens: Sequence[int],
                        block_size: int) -> Event:
    event = _stored(hashes, parent, tokens, block_size, "CPU")
    event["group_idx"] = 0
    event["kv_cache_spec_kind"] = SPEC_KIND
    return event


def lmcache_stored(chunk_hash: int, parent: int | None, tokens: Sequence[int], chunk_size: int,
                   medium: str) -> Event:
    """One LMCache chunk as vLLM's LMCache connector turns it into a `BlockStored` (no extra_keys)."""
    return _stored([chunk_hash], parent, tokens, chunk_size, medium)
