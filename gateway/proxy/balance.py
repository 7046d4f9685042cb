"""Choosing an upstream within a pool: prefix affinity by rendezvous hashing, skipping upstreams that
recently refused connections, so one tenant's repeated prefixes keep hitting the same cache."""

from __future__ import annotations

import hashlib
import time

DOWN_FOR_S = 5.0


def rendezvous_order(upstreams: list[str], affinity: str) -> list[str]:
    """Every upstream ranked for this key; removing one upstream moves only the keys it held."""
    def score(upstream: str) -> bytes:
        return hashlib.blake2b(f"{affinity}\0{upstream}".encode(), digest_size=8).digest()
    return sorted(upstreams, key=score, reverse=True)


class UpstreamHealth:
    """Upstreams that refused a connection are skipped for a few seconds, then tried again."""

    def __init__(self, down_for_s: float = DOWN_FOR_S) -> None:
        self.down_for_s = down_for_s
        self._down_until: dict[str, float] = {}

    def mark_down(self, upstream: str) -> None:
        self._down_until[upstream] = time.monotonic() + self.down_for_s

    def is_up(self, upstream: str) -> bool:
        until = self._down_until.get(upstream)
        return until is None or until <= time.monotonic()

    def candidates(self, upstreams: list[str], affinity: str) -> list[str]:
        """Healthy upstreams first, in affinity order; the rest after, as a last resort."""
        ranked = rendezvous_order(upstreams, affinity) if len(upstreams) > 1 else upstreams
        return [u for u in ranked if self.is_up(u)] + [u for u in ranked if not self.is_up(u)]
