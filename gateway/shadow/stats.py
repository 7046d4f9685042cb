"""Per-tenant summary of shadow pairs: ΔTTFT quantiles, a bootstrap CI of the median, mismatches. Pure."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

from gateway.shadow.compare import PairRecord

MIN_PAIRS = 20
BOOTSTRAP_ROUNDS = 1000
BOOTSTRAP_SEED = 20261129


def quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def bootstrap_median_ci(values: Sequence[float], rounds: int = BOOTSTRAP_ROUNDS) -> list[float] | None:
    """95 % percentile-bootstrap interval of the median (deterministic seed, so reports are reproducible)."""
    if len(values) < 2:
        return None
    rng = random.Random(BOOTSTRAP_SEED)
    size = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=size)) for _ in range(rounds))
    return [medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]]


def tenant_summary(pairs: Sequence[PairRecord], counts: dict[str, int]) -> dict[str, Any]:
    deltas = [pair.ttft_delta_s for pair in pairs if pair.ttft_delta_s is not None]
    compared = sum(1 for pair in pairs if pair.compared_output)
    mismatches = sum(1 for pair in pairs if pair.mismatch)
    cached = [pair.cached_delta for pair in pairs if pair.cached_delta is not None]
    ci = bootstrap_median_ci(deltas)
    return {
        "pairs": len(pairs),
        "dropped": counts.get("dropped", 0),
        "errors": counts.get("error", 0),
        "ttft_pairs": len(deltas),
        "ttft_delta_p50_s": quantile(deltas, 0.5),
        "ttft_delta_p90_s": quantile(deltas, 0.9),
        "ttft_delta_ci95_s": ci,
        "duration_delta_p50_s": quantile([pair.duration_delta_s for pair in pairs], 0.5),
        "compared_outputs": compared,
        "mismatches": mismatches,
        "mismatch_rate": mismatches / compared if compared else None,
        "cached_tokens_delta_mean": statistics.fmean(cached) if cached else None,
        "conclusive": len(deltas) >= MIN_PAIRS and ci is not None and (ci[1] < 0 or ci[0] > 0),
        "verdict": verdict(len(deltas), ci, mismatches),
    }


def verdict(ttft_pairs: int, ci: list[float] | None, mismatches: int) -> str:
    warning = f"; {mismatches} deterministic output mismatch(es): check the connector" if mismatches else ""
    if ttft_pairs < MIN_PAIRS or ci is None:
        return f"too few pairs to conclude ({ttft_pairs} with TTFT, need {MIN_PAIRS})" + warning
    if ci[1] < 0:
        return f"primary is faster: median ΔTTFT CI [{ci[0] * 1000:.1f}, {ci[1] * 1000:.1f}] ms" + warning
    if ci[0] > 0:
        return f"primary is slower: median ΔTTFT CI [{ci[0] * 1000:.1f}, {ci[1] * 1000:.1f}] ms" + warning
    return f"no clear difference: median ΔTTFT CI [{ci[0] * 1000:.1f}, {ci[1] * 1000:.1f}] ms spans 0" + warning
