"""Request ids drawn from a pool of OS randomness: the same 32-hex-character form as before, never repeated
across pool refills, and different between two processes' generators."""

from __future__ import annotations

import re

from gateway.http.request_ids import POOL_BYTES, RequestIds

HEX_ID = re.compile(r"[0-9a-f]{32}")


def test_ids_are_32_hex_characters_and_distinct_across_refills() -> None:
    ids = RequestIds()
    drawn = [ids.next() for _ in range(3 * POOL_BYTES // 16 + 7)]  # three refills and part of a fourth
    assert all(HEX_ID.fullmatch(value) for value in drawn)
    assert len(set(drawn)) == len(drawn)


def test_two_generators_draw_different_ids() -> None:
    first, second = RequestIds(), RequestIds()
    assert {first.next() for _ in range(300)}.isdisjoint({second.next() for _ in range(300)})
