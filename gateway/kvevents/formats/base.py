"""The decoder interface every KV-event format implements, and the choice by name. Pure.

A decoder turns one message payload (the frame after the sequence number) into an `EventBatch` of the
ledger's event types. A decoder may keep state across the batches of its one source (the subscriber makes
one per source and feeds it in sequence order).
"""

from __future__ import annotations

from typing import Protocol

from gateway.kvevents.wire import EventBatch


class Decoder(Protocol):
    def decode(self, payload: bytes) -> EventBatch: ...


def decoder_for(name: str) -> Decoder:
    """A fresh decoder of the named format (`vllm` or `lmcache`)."""
    from gateway.kvevents.formats.lmcache import LMCacheDecoder
    from gateway.kvevents.formats.vllm import VllmDecoder

    if name == "lmcache":
        return LMCacheDecoder()
    if name == "vllm":
        return VllmDecoder()
    raise ValueError(f"unknown KV-event format {name!r}")
