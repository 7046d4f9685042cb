"""SHARDS-style sampling of whole prefix chains, and the per-tenant characters-per-token estimate.

A chain is kept or skipped as a whole by the value of its root fingerprint (a keyed hash, so uniform): kept
when the value is below the threshold, so the sampling rate is threshold / 2**64. Every request that starts
with a kept root is kept, so reuse inside a sampled chain is seen exactly; a planner scales cache sizes by the
rate (Waldspurger et al., "Efficient MRC Construction with SHARDS", FAST '15).

Fixed-size variant: at most `max_roots` distinct sampled roots are tracked per tenant. When one more arrives,
the largest is dropped and the threshold falls to its value, so memory stays bounded however many distinct
prefixes arrive; every record carries the rate in force, and a planner keeps only records whose root value is
below the lowest threshold it reads, which gives one consistent sample.
"""

from __future__ import annotations

import heapq
import math

FULL_THRESHOLD = 1 << 64
FLOAT_SLACK = 1 << 12  # a float rate carries 53 bits of the 64-bit threshold
CPT_GRID_STEPS = 8  # estimate quantised to powers of 2**(1/8): ~9 % steps, so chunking changes rarely
CPT_MIN_OBSERVATIONS = 1  # the first answer already says how this tenant tokenizes; later ones refine it


def root_value(first_fingerprint: bytes) -> int:
    """The uniform 64-bit value a chain is sampled by."""
    return int.from_bytes(first_fingerprint[:8].ljust(8, b"\0"), "big")


def threshold_for_rate(rate: float) -> int:
    """The threshold a recorded rate stands for, rounded down past float error: the root that set a threshold
    (its value equals it, and it was dropped) must stay out of the sample."""
    return FULL_THRESHOLD if rate >= 1.0 else max(0, int(rate * FULL_THRESHOLD) - FLOAT_SLACK)


class ShardsSampler:
    """One tenant's sampler: a threshold and a bounded max-heap of the sampled root values."""

    def __init__(self, rate: float, max_roots: int) -> None:
        self.threshold = FULL_THRESHOLD if rate >= 1.0 else int(rate * FULL_THRESHOLD)
        self.max_roots = max_roots
        self._heap: list[int] = []  # negated values: the largest sampled root on top
        self._roots: set[int] = set()

    @property
    def rate(self) -> float:
        return self.threshold / FULL_THRESHOLD

    @property
    def tracked_roots(self) -> int:
        return len(self._roots)

    def admit(self, value: int) -> bool:
        """Whether the chain with this root value is sampled (and remember it)."""
        if value >= self.threshold:
            return False
        if value in self._roots:
            return True
        heapq.heappush(self._heap, -value)
        self._roots.add(value)
        while len(self._roots) > self.max_roots:
            largest = -heapq.heappop(self._heap)
            self._roots.discard(largest)
            self.threshold = largest
        return value < self.threshold


class CharsPerToken:
    """A tenant's observed characters per prompt token, quantised so that chunk sizes stay put.

    Fingerprints of two requests only match when both were cut at the same chunk size, so the size must not
    follow every request: the running ratio is rounded to a grid of powers of 2**(1/8), and it starts from
    `default` until the first answer with usage.
    """

    def __init__(self, default: float) -> None:
        self.default = default
        self.chars = 0
        self.tokens = 0
        self.observations = 0
        self.current = default

    def observe(self, chars: int, tokens: int) -> None:
        if chars <= 0 or tokens <= 0:
            return
        self.chars += chars
        self.tokens += tokens
        self.observations += 1
        if self.observations >= CPT_MIN_OBSERVATIONS:
            self.current = quantised(self.chars / self.tokens)


def quantised(ratio: float) -> float:
    step = round(math.log2(ratio) * CPT_GRID_STEPS)
    return float(2 ** (step / CPT_GRID_STEPS))
