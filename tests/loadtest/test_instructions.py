"""The instruction-count benchmark (loadtests/instructions.py): a real proxy under callgrind, real requests, and
the count read from the dump taken over the measured requests only; the fixed and per-event split of a proxy's
count recovered from two answer lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.instructions import Count, parse_args, run, summary, valgrind_missing


def test_the_split_recovers_a_fixed_part_and_a_part_per_event() -> None:
    fixed, per_event = 900_000, 12_000
    counts = [Count("gateway", tokens, 0, 10, float(tokens + 2), 10 * (fixed + per_event * (tokens + 2)))
              for tokens in (1, 64)]
    split = summary(counts)["split"]["gateway"]
    assert split == {"fixed": pytest.approx(fixed), "per_event": pytest.approx(per_event)}


def test_compared_target_needs_a_tree_or_a_setting() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--targets", "gateway-compared"])


@pytest.mark.skipif(valgrind_missing() is not None, reason="valgrind is not installed")
def test_the_count_covers_the_measured_requests_only(tmp_path: Path) -> None:
    """Five requests against ten, each after the same warm-up: the counts grow with the requests measured, and
    per request they agree (a count read from the wrong dump, or taken over start-up, would not)."""
    counts = {}
    for requests in (5, 10):
        work = tmp_path / str(requests)
        work.mkdir()
        config = parse_args(["--targets", "floor-asgi", "--tokens", "1", "--requests", str(requests),
                             "--warmup", "4", "--concurrency", "1"])
        (counted,) = run(config, work)
        assert counted.events_per_request == 3  # the role chunk, one token, [DONE]
        counts[requests] = counted
    assert counts[10].instructions > counts[5].instructions > 0
    assert 0.5 < counts[10].per_request / counts[5].per_request < 2.0
