"""The working set per reuse window (gateway.plan.workingset) on traces small enough to work out by hand, and
the window parser."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.plan.workingset import WindowSet, parse_window, working_set
from gateway.reuse.record import TraceRecord
from tests.unit.plan.traces import blocks, rec


def test_an_empty_trace_has_no_window_and_an_unknown_one_off_share() -> None:
    assert working_set([], 600.0, 1.0) == WindowSet(600.0, 0, 0, 0.0, 0.0, 0.0, None)


def test_the_busiest_window_is_reported_with_its_returning_hot_and_one_off_tokens() -> None:
    """Window 0 (t 0-60 s): A twice, B and C once, 72 prompt tokens of which 64 are in full blocks.
    Window 1 (t 100 s): D once. Returning: A (16 tokens); hot: A; one-off: B + C + the 8-token tail = 40 of 72."""
    trace = [rec(["A", "B"], ts=0.0, prompt=40), rec(["A", "C"], ts=10.0, prompt=32), rec(["D"], ts=100.0)]
    view = working_set(trace, 60.0, 1.0)
    assert view == WindowSet(window_s=60.0, windows=2, requests=2, prompt_tokens=72.0, returning_tokens=16.0,
                             hot_tokens=16.0, one_off_share=40 / 72)


def test_a_sampled_trace_scales_sizes_by_the_inverse_rate_but_not_the_share() -> None:
    trace = [rec(["A", "B"], ts=0.0, prompt=40), rec(["A", "C"], ts=10.0, prompt=32)]
    view = working_set(trace, 60.0, 0.25)
    assert (view.requests, view.prompt_tokens, view.returning_tokens, view.hot_tokens) == (8, 288.0, 64.0, 64.0)
    assert view.one_off_share == pytest.approx(40 / 72)


def test_a_window_longer_than_the_trace_is_one_window() -> None:
    trace = [rec(["A"], ts=float(t)) for t in range(0, 50, 10)]
    view = working_set(trace, 3600.0, 1.0)
    assert (view.windows, view.requests, view.returning_tokens, view.one_off_share) == (1, 5, 16.0, 0.0)


def test_windows_are_counted_from_the_first_record_not_from_zero() -> None:
    """Records at 1000 s and 1059 s share the first 60 s window; 1060 s opens the second."""
    trace = [rec(["A"], ts=1000.0), rec(["A"], ts=1059.0), rec(["B"], ts=1060.0)]
    view = working_set(trace, 60.0, 1.0)
    assert (view.windows, view.requests, view.returning_tokens) == (2, 2, 16.0)


def test_ties_on_returning_tokens_go_to_the_window_with_more_prompt_tokens() -> None:
    quiet = [rec(["A"], ts=0.0), rec(["A"], ts=1.0)]
    busy = [rec(["B"], ts=60.0), rec(["B"], ts=61.0), rec(["C"], ts=62.0)]
    view = working_set(quiet + busy, 60.0, 1.0)
    assert (view.requests, view.prompt_tokens, view.returning_tokens) == (3, 48.0, 16.0)


def _repeated(name: str, times: int) -> list[TraceRecord]:
    return [rec([name]) for _ in range(times)]


@pytest.mark.parametrize(("returns", "hot_blocks"), [
    ((8, 1, 1), 1),  # X alone makes exactly 80 % of the 10 returns: the boundary is inclusive
    ((7, 2, 1), 2),  # X is 70 %: X and Y are needed
    ((1, 1, 1), 3),  # even spread: 3 of 3 are needed (2 of 3 is 67 %)
    ((4, 0, 0), 1),  # only X returns
])
def test_the_hot_set_is_the_fewest_blocks_covering_80_percent_of_returns(returns: tuple[int, int, int],
                                                                          hot_blocks: int) -> None:
    trace = [record for name, count in zip("XYZ", returns, strict=True) for record in _repeated(name, count + 1)]
    view = working_set(trace, 600.0, 1.0)
    assert view.returning_tokens == 16.0 * sum(1 for count in returns if count)
    assert view.hot_tokens == 16.0 * hot_blocks


def test_nothing_returning_means_no_hot_set_and_all_one_off() -> None:
    trace = [rec(blocks(f"upload{i}", 4), ts=float(i)) for i in range(5)]
    view = working_set(trace, 600.0, 1.0)
    assert (view.returning_tokens, view.hot_tokens, view.one_off_share) == (0.0, 0.0, 1.0)


def test_a_block_repeated_inside_one_prompt_counts_as_returning() -> None:
    """The counter is per fingerprint occurrence, so a prompt that repeats a block reuses it."""
    view = working_set([rec(["A", "A", "B"])], 60.0, 1.0)
    assert view.returning_tokens == 16.0
    assert view.one_off_share == pytest.approx(16 / 48)


def test_text_fingerprints_weigh_their_tokens_per_chunk() -> None:
    trace = [rec(["A", "B"], per_chunk=12.5, text=True, prompt=25), rec(["A"], per_chunk=12.5, text=True, prompt=13)]
    view = working_set(trace, 60.0, 1.0)
    assert view.returning_tokens == 12.5
    assert view.one_off_share == pytest.approx((12.5 + 0.5) / 38)  # B, plus the half token past A in the second


def test_a_prompt_with_no_tokens_has_an_unknown_one_off_share() -> None:
    assert working_set([rec([], prompt=0)], 60.0, 1.0).one_off_share is None


@given(st.lists(st.tuples(st.integers(0, 600), st.lists(st.sampled_from("ABCDEF"), max_size=6)), min_size=1,
                max_size=25))
@settings(max_examples=60, deadline=None)
def test_invariants_of_any_window(shape: list[tuple[int, list[str]]]) -> None:
    """hot <= returning <= prompt tokens; the one-off share is a share; the busiest window holds >= 1 request."""
    trace = [rec(names, ts=float(ts)) for ts, names in sorted(shape)]
    view = working_set(trace, 120.0, 1.0)
    assert 0.0 <= view.hot_tokens <= view.returning_tokens <= view.prompt_tokens
    assert view.one_off_share is None or 0.0 <= view.one_off_share <= 1.0
    assert 1 <= view.requests <= len(trace) and 1 <= view.windows <= 6


@pytest.mark.parametrize(("text", "seconds"), [
    ("10m", 600.0), ("1h", 3600.0), ("24h", 86400.0), ("90s", 90.0), ("2d", 172800.0), (" 1.5h ", 5400.0),
    ("0.5s", 0.5), ("1e2s", 100.0),
])
def test_parse_window_accepts_a_number_and_a_unit(text: str, seconds: float) -> None:
    assert parse_window(text) == seconds


@pytest.mark.parametrize(("text", "message"), [
    ("", "use a number and one of s, m, h, d"),
    ("m", "use a number and one of s, m, h, d"),
    ("10", "use a number and one of s, m, h, d"),
    ("10x", "use a number and one of s, m, h, d"),
    ("10M", "use a number and one of s, m, h, d"),
    ("tenm", "use a number and one of s, m, h, d"),
    ("0m", "must be positive"),
    ("-1h", "must be positive"),
    ("nanh", "must be positive"),
    ("infm", "must be positive"),
])
def test_parse_window_refuses_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_window(text)
