"""LMCache in-process mode (`--lmcache`), modelled on LMCache 0.5's vLLM adapter. See docs/lmcache.md.

- Identity of a chunk: the prompt's tokens up to the chunk's end, plus the request's `lmcache.tag.*` entries of
  `kv_transfer_params`, plus `cache_salt` — unless `--lmcache-ignore-salt`, which behaves like the LMCache
  and vLLM versions that left the salt out (two salts, one entry).
- Chunks are `--lmcache-chunk-size` tokens (LMCache's default 256); only full prompt chunks are stored, all
  of them unless `lmcache.skip_save` is true. Lookup counts leading stored chunks from the start of the
  prompt; tokens beyond the GPU hit are loaded (the last prompt token is always recomputed). LRU eviction
  of `--lmcache-chunks` chunks, with no removal events: LMCache reports none.
- Events: one `BlockStored` per new chunk as vLLM's LMCache connector forwards them: the chunk's token-only
  prefix hash, the previous chunk's hash as parent, the chunk's tokens plus the next stored chunk's first
  (257 ids for 256-token chunks, the last stored chunk 256, as captured), block_size = chunk size, no
  `extra_keys`, `medium` = `--lmcache-medium` (LMCache's own lower-case names, e.g. `cpu`). The hash carries
  no tag or salt, as in LMCache, so two identities storing one prefix send the same hashes.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from gateway.sim import kv_events
from gateway.sim.config import SimConfig
from gateway.sim.hashing import chain_hashes
from gateway.sim.kv_events import Event

TAG_PREFIX = "lmcache.tag."
SKIP_SAVE = "lmcache.skip_save"


def lmcache_entries(body: dict[str, Any]) -> dict[str, Any]:
    """The `lmcache.*` entries of a request's kv_transfer_params (what LMCache's adapter copies)."""
    params = body.get("kv_transfer_params")
    if not isinstance(params, dict):
        return {}
    return {key: value for key, value in params.items() if isinstance(key, str) and key.startswith("lmcache.")}


def identity(entries: dict[str, Any], salt: str | None, ignore_salt: bool) -> str:
    """Who a chunk belongs to: the sorted (name, value) tags and the salt, serialised so that no tag name or
    value can imitate another identity (a joined string would let a tag named `salt` pass for a cache_salt)."""
    tags = sorted((key[len(TAG_PREFIX):], str(value)) for key, value in entries.items() if key.startswith(TAG_PREFIX))
    return json.dumps([tags, salt if salt and not ignore_salt else None])


def _keyed(chunk_hashes: Sequence[int], who: str) -> list[bytes]:
    return [hashlib.sha256(who.encode() + b"\0" + h.to_bytes(8, "big")).digest() for h in chunk_hashes]


class LMCacheConnector:
    def __init__(self, config: SimConfig, events_enabled: bool) -> None:
        self._chunk = config.lmcache_chunk_size
        self._capacity = config.lmcache_chunks
        self._ignore_salt = config.lmcache_ignore_salt
        self._medium = config.lmcache_medium
        self._events = events_enabled
        self._store: OrderedDict[bytes, None] = OrderedDict()
        self.hit_tokens_total = 0
        self.stored_tokens_total = 0

    def __len__(self) -> int:
        return len(self._store)

    def clear(self) -> None:
        self._store.clear()

    def chunk_hashes(self, prompt: Sequence[int]) -> list[int]:
        return chain_hashes(prompt, self._chunk, None)

    def hit_tokens(self, prompt: Sequence[int], body: dict[str, Any], salt: str | None, gpu_hit: int) -> int:
        keys = _keyed(self.chunk_hashes(prompt), identity(lmcache_entries(body), salt, self._ignore_salt))
        leading = next((i for i, key in enumerate(keys) if key not in self._store), len(keys))
        hit = min(leading * self._chunk, len(prompt) - 1)
        return hit - gpu_hit if hit > gpu_hit else 0

    def load(self, prompt: Sequence[int], body: dict[str, Any], salt: str | None, loaded: int) -> None:
        keys = _keyed(self.chunk_hashes(prompt), identity(lmcache_entries(body), salt, self._ignore_salt))
        for key in keys[: -(-loaded // self._chunk)]:
            if key in self._store:
                self._store.move_to_end(key)
        self.hit_tokens_total += loaded

    def store(self, prompt: Sequence[int], body: dict[str, Any], salt: str | None) -> list[Event]:
        entries = lmcache_entries(body)
        if entries.get(SKIP_SAVE) is True:
            return []
        hashes = self.chunk_hashes(prompt)
        events = []
        for index, key in enumerate(_keyed(hashes, identity(entries, salt, self._ignore_salt))):
            if key in self._store:
                self._store.move_to_end(key)
                continue
            self._insert(key)
            self.stored_tokens_total += self._chunk
            events.append(self._stored_event(index, prompt, hashes))
        return events if self._events else []

    def _insert(self, key: bytes) -> None:
        while len(self._store) >= self._capacity:
            self._store.popitem(last=False)  # LMCache evicts silently: no event
        self._store[key] = None

    def _stored_event(self, index: int, prompt: Sequence[int], hashes: Sequence[int]) -> Event:
        parent = hashes[index - 1] if index else None
        # As captured from LMCache 0.5.6: a chunk's token_ids run one token into the next stored chunk (257 ids
        # for 256-token chunks); the last stored chunk has only its own.
        stored_end = len(hashes) * self._chunk
        tokens = prompt[index * self._chunk : min((index + 1) * self._chunk + 1, stored_end)]
        return kv_events.lmcache_stored(hashes[index], parent, tokens, self._chunk, self._medium)
