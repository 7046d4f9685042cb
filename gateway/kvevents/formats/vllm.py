"""vLLM's own KV events: the default format. The decoding itself lives in `gateway.kvevents.wire`."""

from __future__ import annotations

from gateway.kvevents.wire import BatchDecoder as VllmDecoder

__all__ = ["VllmDecoder"]
