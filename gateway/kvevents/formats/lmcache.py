"""LMCache's blocks as they reach vLLM's KV-event stream, decoded and attributed. Pure, stateful per source.

What LMCache 0.5.6 sends (read from its wheel's cache engine, its multi-process vLLM adapter, and vLLM
0.25.0's LMCache connector; docs/lmcache.md): one `BlockStored` per stored chunk, with LMCache's own prefix
hash of the chunk's tokens, the previous chunk's hash as parent, the chunk's token ids, `block_size` = tokens
in the chunk and no `extra_keys`. In-process, the medium is always `cpu`, whichever backend keeps the chunk,
and nothing is ever removed. In multi-process mode the adapter relays the server's first-tier (`CPU`) stores
and removals only. So evictions from in-process tiers, and every move or placement below the first tier of an
LMCache server, are never observed. On a pool whose connector is LMCache every non-GPU event is LMCache's.

Two consequences handled here:
- Medium names map onto the policy vocabulary (`allowed_media`): memory tiers to CPU, disk-like backends to
  DISK, network backends to REMOTE; an unknown name stays itself, upper-cased, so it can only be a violation.
- The chunk hash carries neither tag nor salt, so two tenants storing one prefix send the same hash. A chunk
  is attributed to the GPU chain (vLLM's own events on the same stream, whose root carries the salt) that
  last held exactly that token prefix on this server, and gets a hash of its own per owner, so the two
  tenants' copies are two ledger records. A chunk whose prefix no GPU chain held stays unattributed.
  Caveat: when two identities computed the same prefix in one engine step, the later one is named.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

import msgspec

from gateway.kvevents.media import CPU, DISK, GPU, REMOTE, BlockMedium
from gateway.kvevents.wire import (
    AllBlocksCleared,
    BatchDecoder,
    BlockRemoved,
    BlockStored,
    EventBatch,
    HashValue,
    KvEvent,
    convert_event,
)

MEDIUM_GROUPS: dict[BlockMedium, tuple[str, ...]] = {
    CPU: ("cpu", "localcpubackend", "local_cpu", "pinned", "cxl"),
    DISK: ("disk", "localdiskbackend", "local_disk", "gds", "gdsbackend", "weka", "nvme", "file", "fs"),
    REMOTE: ("remote", "remotebackend", "redis", "valkey", "lm", "mooncake", "infinistore", "s3", "nixl",
               "p2p", "blackhole"),
}
MEDIUM_OF = {name: group for group, names in MEDIUM_GROUPS.items() for name in names}
UNOBSERVED = ("evictions from in-process LMCache tiers (it sends no removal events: such blocks stay resident here)",
              "which LMCache tier holds a chunk (in-process events call every tier cpu)",
              "placements and moves below an LMCache server's first tier (multi-process mode relays CPU only)")
PREFIX_CAPACITY = 200_000  # GPU blocks remembered per source: far more than one server caches
# (chained hash of the token prefix, its length), chained per GPU block: an LMCache chunk (a whole number of GPU
# blocks) gets the same value by hashing its tokens block by block. Python's hash of a tuple of ints is not
# salted per process and runs in C; a 64-bit collision could only misname a chunk's owner, never its content.
Prefix = tuple[int, int]


def lmcache_medium(name: str | None) -> BlockMedium:
    """The policy medium for an LMCache medium name."""
    if not name:
        return CPU
    return MEDIUM_OF.get(name.lower(), name.upper())


class _TokenStored(msgspec.Struct, tag="BlockStored", frozen=True):
    block_hashes: list[HashValue]
    parent_block_hash: HashValue | None = None
    token_ids: list[int] | None = None
    block_size: int | None = None
    medium: str | None = None
    extra_keys: list[Any] | None = None


_Event = _TokenStored | BlockRemoved | AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Event]
    data_parallel_rank: int | None = None


class _Bounded(OrderedDict[Any, Any]):
    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        if len(self) > PREFIX_CAPACITY:
            self.popitem(last=False)


def extend(prefix: Prefix, tokens: list[int], block: int) -> Prefix:
    """The prefix after `tokens`, taken `block` tokens at a time (the GPU block size)."""
    value, length = prefix
    for start in range(0, len(tokens), block):
        value = hash((value, tuple(tokens[start : start + block])))
    return value, length + len(tokens)


class LMCacheDecoder:
    """vLLM's envelope and GPU events as `wire` decodes them, plus LMCache's chunks, mapped and attributed."""

    def __init__(self) -> None:
        self._typed = msgspec.msgpack.Decoder(_Batch)
        self._fallback = BatchDecoder()  # older array-encoded or unusual payloads: no token ids, no attribution
        self._gpu: _Bounded = _Bounded()  # GPU block hash -> (prefix, root extra keys)
        self._owner_of_prefix: _Bounded = _Bounded()  # prefix -> root extra keys of the chain that held it
        self._chunks: _Bounded = _Bounded()  # LMCache chunk hash -> its prefix
        self._owned: _Bounded = _Bounded()  # LMCache chunk hash -> the hashes the ledger was given for it
        # A GPU block's own tokens -> the prefix before it: finds where an LMCache chunk starts when LMCache gives
        # it no usable parent (a store that skips already-saved leading chunks names parent 0).
        self._block_start: _Bounded = _Bounded()
        self._gpu_block_size = 0

    def decode(self, payload: bytes) -> EventBatch:
        try:
            batch = self._typed.decode(payload)
        except msgspec.DecodeError:
            return self._decode_event_by_event(payload)
        return EventBatch(ts=batch.ts, events=[self._convert(event) for event in batch.events])

    def _decode_event_by_event(self, payload: bytes) -> EventBatch:
        """A batch the typed path refused (an event of a type unknown here, array-encoded events): the plain vLLM
        decoding checks the envelope and reads the arrays, and every map event is still converted here, so one
        unreadable event costs only itself (skipped and counted), not its batch's owners and medium names."""
        plain = self._fallback.decode(payload)  # WireError when the payload is not a batch at all
        items = msgspec.msgpack.decode(payload)[1]
        if not any(isinstance(item, dict) for item in items):
            return plain
        events = [event for item in items if (event := self._one(item)) is not None]
        return EventBatch(ts=plain.ts, events=events, skipped=len(items) - len(events))

    def _one(self, item: Any) -> KvEvent | None:
        if not isinstance(item, dict):
            return convert_event(item)  # a positional array carries no token ids: no attribution
        try:
            event: _Event = msgspec.convert(item, _Event)
        except msgspec.ValidationError:
            return convert_event(item)  # still vLLM's event (token ids unreadable: no attribution), or None
        return self._convert(event)

    def _convert(self, event: _Event) -> KvEvent:
        if isinstance(event, BlockRemoved) and event.medium not in (None, GPU):
            return self._removed(event)
        if not isinstance(event, _TokenStored):
            return event
        if event.medium in (None, GPU):
            self._learn_gpu(event)
            return BlockStored(event.block_hashes, event.parent_block_hash, event.medium, event.extra_keys)
        return self._chunk(event)

    def _removed(self, event: BlockRemoved) -> BlockRemoved:
        """A chunk hash names the content, not the owner: its removal closes every owner's record of it."""
        hashes: list[HashValue] = []
        for chunk_hash in event.block_hashes:
            hashes += self._owned.pop(chunk_hash, [chunk_hash])
        return BlockRemoved(hashes, lmcache_medium(event.medium))

    def _learn_gpu(self, event: _TokenStored) -> None:
        if not event.token_ids or not event.block_size:
            return
        if event.parent_block_hash is None:
            state: tuple[Prefix, Any] | None = ((0, 0), event.extra_keys[0] if event.extra_keys else None)
        else:
            state = self._gpu.get(event.parent_block_hash)
        if state is None:
            return
        prefix, root = state
        size = self._gpu_block_size = event.block_size
        for index, block_hash in enumerate(event.block_hashes):
            tokens = event.token_ids[index * size : (index + 1) * size]
            self._block_start.remember(hash(tuple(tokens)), prefix)
            prefix = extend(prefix, tokens, size)
            self._gpu.remember(block_hash, (prefix, root))
            self._owner_of_prefix.remember(prefix, root)

    def _chunk(self, event: _TokenStored) -> BlockStored:
        medium = lmcache_medium(event.medium)
        chunk_hash = event.block_hashes[0] if event.block_hashes else 0
        tokens = chunk_tokens(event)
        start = (0, 0) if event.parent_block_hash is None else self._chunks.get(event.parent_block_hash)
        if start is None and tokens and self._gpu_block_size:
            start = self._block_start.get(hash(tuple(tokens[: self._gpu_block_size])))
        root = None
        if start is not None and tokens and self._gpu_block_size:
            prefix = extend(start, tokens, self._gpu_block_size)
            self._chunks.remember(chunk_hash, prefix)
            root = self._owner_of_prefix.get(prefix)
        hashes: list[HashValue] = event.block_hashes if root is None else [owned_hash(root, chunk_hash)]
        known = self._owned.get(chunk_hash, [])
        self._owned.remember(chunk_hash, known + [h for h in hashes if h not in known])
        return BlockStored(hashes, None, medium, None if root is None else [root])


def chunk_tokens(event: _TokenStored) -> list[int]:
    """The chunk's own tokens. vLLM 0.25.0 relays each LMCache chunk with `block_size` + 1 token ids: its own
    tokens and the first token of the next chunk (seen in a capture from an H200 run, 2026-12-01:
    tests/fixtures/vllm-0.25.0/kv-events/lmcache_kv_events.sample.jsonl). Only the first `block_size` are the chunk."""
    tokens = event.token_ids or []
    if event.block_size and len(tokens) > event.block_size:
        return tokens[: event.block_size]
    return tokens


def owned_hash(root: Any, chunk_hash: HashValue) -> int:
    """A per-owner 64-bit hash for an LMCache chunk (its own hash is the same for every tenant)."""
    digest = hashlib.sha256(msgspec.msgpack.encode([root, chunk_hash])).digest()
    return int.from_bytes(digest[:8], "big")
