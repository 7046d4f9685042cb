"""The fixed-size SHARDS sampler and the characters-per-token estimate (pure functions)."""

from __future__ import annotations

import random

from gateway.reuse.sampling import FULL_THRESHOLD, CharsPerToken, ShardsSampler, threshold_for_rate


def test_keeps_exactly_the_smallest_roots_within_its_bound() -> None:
    rng = random.Random(5)
    values = [rng.randrange(FULL_THRESHOLD) for _ in range(5000)]
    sampler = ShardsSampler(rate=1.0, max_roots=100)
    admitted = {value for value in values if sampler.admit(value)}
    assert sampler.tracked_roots == 100
    assert sorted(values)[:100] == sorted(v for v in admitted if v < sampler.threshold)
    assert sampler.rate < 100 / 5000 * 1.5  # about max_roots / distinct roots
    assert all(v >= threshold_for_rate(sampler.rate) for v in sorted(values)[100:])
    assert sampler.admit(sorted(values)[0])  # a kept root stays kept


def test_chars_per_token_is_quantised_and_starts_from_the_default() -> None:
    estimate = CharsPerToken(4.0)
    assert estimate.current == 4.0
    estimate.observe(3700, 1000)
    first = estimate.current
    assert abs(first - 3.7) / 3.7 < 0.05
    estimate.observe(3720, 1000)  # a slightly different ratio does not move the chunk size
    assert estimate.current == first
    estimate.observe(0, 10)  # nothing to learn from
    assert estimate.observations == 2
