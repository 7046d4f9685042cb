"""The shadow store's interface: settled pairs (the latest KEEP_PAIRS per tenant) and outcome counters."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple, Protocol

import msgspec

from gateway.shadow.compare import PairRecord

KEEP_PAIRS = 5000  # per tenant: enough for stable quantiles, bounded in size
OutcomeCounts = dict[tuple[str, str], int]  # (tenant, outcome) → how many more


class TenantResults(NamedTuple):
    pairs: list[PairRecord]
    counts: dict[str, int]


class ShadowStore(Protocol):
    async def write(self, pairs: list[PairRecord], counts: OutcomeCounts) -> None:
        """Append pairs and add to outcome counters, all in one atomic write."""

    async def results(self, tenant: str) -> TenantResults:
        """The tenant's kept pairs (newest first) and its counters, read together: a write is in both or in
        neither."""
        ...

    async def close(self) -> None: ...


def encode_pair(pair: PairRecord) -> bytes:
    return msgspec.json.encode(dataclasses.asdict(pair))


def decode_pair(raw: bytes | str) -> PairRecord:
    return PairRecord(**msgspec.json.decode(raw))
