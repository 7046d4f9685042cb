"""Small statistics: quantiles and percentile-bootstrap confidence intervals of a median (seeded, repeatable)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

from gateway.shadow.stats import quantile

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 20261129

__all__ = ["mean", "median_ci", "median_difference_ci", "quantile"]


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _bounds(draws: list[float], level: float) -> tuple[float, float]:
    draws.sort()
    tail = (1 - level) / 2
    low = quantile(draws, tail)
    high = quantile(draws, 1 - tail)
    assert low is not None and high is not None
    return low, high


def median_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median."""
    if not values:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    size = len(values)
    draws = [statistics.median(rng.choices(values, k=size)) for _ in range(BOOTSTRAP_RESAMPLES)]
    return _bounds(draws, level)


def median_difference_ci(
    treated: Sequence[float], control: Sequence[float], level: float = 0.95
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of median(treated) − median(control), the two resampled independently."""
    if not treated or not control:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    draws = [statistics.median(rng.choices(treated, k=len(treated)))
             - statistics.median(rng.choices(control, k=len(control))) for _ in range(BOOTSTRAP_RESAMPLES)]
    return _bounds(draws, level)
