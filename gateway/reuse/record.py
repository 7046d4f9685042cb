"""One line of the reuse trace: what a generation request looked like to the cache, without its text."""

from __future__ import annotations

import msgspec

from gateway.reuse.fingerprint import FINGERPRINT_BYTES


class TraceRecord(msgspec.Struct, frozen=True, array_like=True):
    """A sampled generation request. `chain` is the concatenation of its prefix fingerprints."""

    ts: float  # unix time the request ended
    tenant: str
    pool: str
    epoch: int  # the tenant's salt epoch: `tenant forget` erases everything below the new one
    prompt_tokens: int  # from usage
    cached_tokens: int  # from usage: GPU prefix-cache hits plus tokens loaded from a connector
    completion_tokens: int
    text: bool  # chunks of a canonical rendering (True) or exact token-id blocks (False)
    chunk_units: int  # tokens (token ids) or characters (text) per chunk
    tokens_per_chunk: float  # exact for token ids; for text, chunk characters × this request's tokens per char
    rate: float  # sampling rate in force when it was recorded
    chain: bytes
    # kv_transfer_params as sent (policy caps, and offload admission's 0 for a prefix that has not returned):
    max_offload_tokens: int | None = None  # the tier stores only chunks within the first N prompt tokens
    max_load_tokens: int | None = None  # the tier loads at most N tokens (a server may ignore it: vLLM 0.25 does)

    @property
    def chunks(self) -> int:
        return len(self.chain) // FINGERPRINT_BYTES

    def fingerprint(self, index: int) -> bytes:
        return self.chain[index * FINGERPRINT_BYTES : (index + 1) * FINGERPRINT_BYTES]

    def fingerprint_list(self) -> list[bytes]:
        size = FINGERPRINT_BYTES
        return [self.chain[i : i + size] for i in range(0, len(self.chain), size)]


ENCODER = msgspec.msgpack.Encoder()
DECODER = msgspec.msgpack.Decoder(TraceRecord)


def encode_record(record: TraceRecord) -> bytes:
    return ENCODER.encode(record)


def decode_record(raw: bytes) -> TraceRecord:
    return DECODER.decode(raw)
