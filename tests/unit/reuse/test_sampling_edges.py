"""The SHARDS sampler and the characters-per-token grid at their edges: root values from short fingerprints, the
threshold a recorded rate stands for, a sampler's state machine (below, at and above the threshold; repeats; the
bound), and the quantisation grid with literal values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.reuse.sampling import (
    FLOAT_SLACK,
    FULL_THRESHOLD,
    CharsPerToken,
    ShardsSampler,
    quantised,
    root_value,
    threshold_for_rate,
)


@pytest.mark.parametrize(("fingerprint", "value"), [
    (b"\x00" * 8, 0),
    (b"\xff" * 8, 2**64 - 1),
    (b"\x01" + b"\x00" * 7, 2**56),  # big-endian
    (b"\x01\x02", 0x0102 << 48),  # a short fingerprint is padded on the right
    (b"", 0),
    (b"\x00" * 7 + b"\x05" + b"ignored", 5),
])
def test_a_root_value_is_the_first_8_bytes_big_endian(fingerprint: bytes, value: int) -> None:
    assert root_value(fingerprint) == value


@pytest.mark.parametrize(("rate", "threshold"), [
    (1.0, FULL_THRESHOLD), (1.5, FULL_THRESHOLD), (0.5, 2**63 - FLOAT_SLACK), (0.0, 0), (1e-30, 0),
])
def test_a_recorded_rate_stands_for_a_threshold_rounded_down(rate: float, threshold: int) -> None:
    assert threshold_for_rate(rate) == threshold


def test_a_sampler_admits_below_its_threshold_only() -> None:
    sampler = ShardsSampler(rate=0.5, max_roots=10)
    assert sampler.threshold == 2**63 and sampler.rate == 0.5
    assert [sampler.admit(value) for value in (0, 2**63 - 1, 2**63, 2**64 - 1)] == [True, True, False, False]
    assert sampler.tracked_roots == 2  # refused roots are not remembered


def test_a_repeated_root_is_admitted_again_and_tracked_once() -> None:
    sampler = ShardsSampler(rate=1.0, max_roots=2)
    assert [sampler.admit(7) for _ in range(5)] == [True] * 5
    assert sampler.tracked_roots == 1 and sampler.rate == 1.0


def test_one_root_over_the_bound_drops_the_largest_and_lowers_the_threshold_to_it() -> None:
    sampler = ShardsSampler(rate=1.0, max_roots=2)
    assert sampler.admit(100) and sampler.admit(300)
    assert sampler.admit(200) is True  # 300 leaves; the threshold falls to 300
    assert (sampler.threshold, sampler.tracked_roots) == (300, 2)
    assert sampler.admit(300) is False  # the dropped root stays out
    assert sampler.admit(250) is False  # the largest of 100, 200, 250: dropped at once, threshold 250
    assert sampler.admit(50) is True  # 200 leaves, threshold 200
    assert (sampler.threshold, sampler.tracked_roots, sampler.admit(200), sampler.admit(100)) == (200, 2, False, True)


def test_a_root_that_itself_goes_over_the_bound_is_refused() -> None:
    sampler = ShardsSampler(rate=1.0, max_roots=1)
    assert sampler.admit(10) is True
    assert sampler.admit(20) is False  # the newcomer is the largest: dropped at once, threshold 20
    assert (sampler.threshold, sampler.tracked_roots) == (20, 1)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=200), st.integers(1, 20))
def test_the_threshold_only_falls_and_memory_stays_bounded(values: list[int], bound: int) -> None:
    sampler = ShardsSampler(rate=1.0, max_roots=bound)
    thresholds = [sampler.threshold]
    for value in values:
        admitted = sampler.admit(value)
        assert admitted is (value < sampler.threshold)
        thresholds.append(sampler.threshold)
        assert sampler.tracked_roots <= bound
    assert thresholds == sorted(thresholds, reverse=True)
    kept = sorted(set(values))[:bound]
    assert all(sampler.admit(value) for value in kept if value < sampler.threshold)


@pytest.mark.parametrize(("ratio", "grid"), [
    (4.0, 4.0), (1.0, 1.0), (0.5, 0.5), (13.5, 2 ** (30 / 8)), (14.2, 2 ** (31 / 8)), (3.7, 2 ** (15 / 8)),
])
def test_ratios_snap_to_powers_of_the_eighth_root_of_two(ratio: float, grid: float) -> None:
    assert quantised(ratio) == pytest.approx(grid)


@pytest.mark.parametrize(("chars", "tokens"), [(0, 10), (10, 0), (-5, 3), (3, -5)])
def test_an_observation_without_both_counts_is_ignored(chars: int, tokens: int) -> None:
    estimate = CharsPerToken(4.0)
    estimate.observe(chars, tokens)
    assert (estimate.current, estimate.observations, estimate.chars, estimate.tokens) == (4.0, 0, 0, 0)


def test_the_estimate_is_the_ratio_of_the_totals_not_the_mean_of_ratios() -> None:
    estimate = CharsPerToken(4.0)
    estimate.observe(100, 100)  # ratio 1.0
    estimate.observe(1900, 100)  # ratio 19.0
    estimate.observe(0, 0)  # ignored
    estimate.observe(1000, 800)  # ratio 1.25; totals 3000 / 1000 = 3.0, while the mean of the ratios is 7.08
    assert estimate.current == pytest.approx(quantised(3.0))
    assert estimate.observations == 3
