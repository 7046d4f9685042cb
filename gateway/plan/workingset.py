"""The useful working set per reuse window: which prefix tokens come back, how concentrated they are, and how
much of the traffic never returns.

The trace is cut into consecutive windows of the given length (one window when the trace is shorter). In each
window, a fingerprint (about one block of a prefix) *returns* when it is seen more than once. Reported for the
busiest window (most returning tokens):

- returning tokens: distinct prefix tokens seen at least twice — what a reuse tier would have to hold;
- hot set: the fewest returning tokens that account for 80 % of the returns (blocks by how often they return);
- one-off share: prompt tokens in blocks seen once, over all prompt tokens (a partial last block counts
  as one-off too: vLLM never caches it).

Sampled traces are scaled by 1/rate (SHARDS), and so are these sizes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.reuse.record import TraceRecord

HOT_SHARE = 0.8


@dataclass(frozen=True)
class WindowSet:
    window_s: float
    windows: int  # how many windows the trace spans
    requests: int  # in the busiest window
    prompt_tokens: float
    returning_tokens: float
    hot_tokens: float
    one_off_share: float | None


def working_set(records: Sequence[TraceRecord], window_s: float, rate: float) -> WindowSet:
    if not records:
        return WindowSet(window_s, 0, 0, 0.0, 0.0, 0.0, None)
    start = records[0].ts
    groups: dict[int, list[TraceRecord]] = {}
    for record in records:
        groups.setdefault(int((record.ts - start) // window_s), []).append(record)
    views = [_window(window_s, len(groups), group, rate) for group in groups.values()]
    return max(views, key=lambda view: (view.returning_tokens, view.prompt_tokens))


def _window(window_s: float, windows: int, records: list[TraceRecord], rate: float) -> WindowSet:
    seen: Counter[bytes] = Counter()
    size: dict[bytes, float] = {}
    prompt_tokens = 0.0
    for record in records:
        prompt_tokens += record.prompt_tokens
        for fingerprint in record.fingerprint_list():
            seen[fingerprint] += 1
            size[fingerprint] = record.tokens_per_chunk
    returning = [(count - 1, size[fp]) for fp, count in seen.items() if count > 1]
    once = sum(size[fp] for fp, count in seen.items() if count == 1)
    covered = sum(size[fp] * count for fp, count in seen.items())
    one_off = once + max(0.0, prompt_tokens - covered)
    scale = 1.0 / rate
    return WindowSet(window_s, windows, round(len(records) * scale), prompt_tokens * scale,
                     sum(tokens for _, tokens in returning) * scale, _hot_tokens(returning) * scale,
                     one_off / prompt_tokens if prompt_tokens else None)


def _hot_tokens(returning: list[tuple[int, float]]) -> float:
    total_returns = sum(returns for returns, _ in returning)
    if not total_returns:
        return 0.0
    covered = 0
    tokens = 0.0
    for returns, size in sorted(returning, key=lambda item: item[0], reverse=True):
        covered += returns
        tokens += size
        if covered >= HOT_SHARE * total_returns:
            break
    return tokens


def parse_window(text: str) -> float:
    """`10m`, `1h`, `24h`, `90s`, `2d` → seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    text = text.strip()
    if len(text) < 2 or text[-1] not in units:
        raise ValueError(f"window {text!r}: use a number and one of s, m, h, d (e.g. 10m)")
    try:
        value = float(text[:-1])
    except ValueError:
        raise ValueError(f"window {text!r}: use a number and one of s, m, h, d (e.g. 10m)") from None
    if not math.isfinite(value) or value <= 0:  # nan and inf parse as floats but cut no windows
        raise ValueError(f"window {text!r} must be positive")
    return value * units[text[-1]]
