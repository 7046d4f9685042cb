"""Salted block-hash chains (pure): known-answer values, vLLM's chaining rules, continuation from a parent.

The literal values were computed once, outside the product, from the documented serialisation: SHA-256 over the
parent's 8 bytes big-endian, the block's token ids as little-endian uint32, then 0x01 + salt (root block with a
salt) or 0x00; the hash is the digest's low 64 bits read big-endian. The root parent is the low 64 bits of
SHA-256("kvgate-sim-none-hash").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.hashing import ROOT_PARENT, block_hash, chain_hashes

ROOT = 8690309239039905957
FIRST, SECOND = 13014909216165361037, 17620012508659035771  # blocks [100..103], [104..107], no salt
SALTED_FIRST, SALTED_SECOND = 3110653221058743661, 13027431248946573224  # the same, salt "tenant-a"
TOKENS = list(range(100, 108))


def test_known_answer_values() -> None:
    assert ROOT_PARENT == ROOT
    assert block_hash(ROOT, TOKENS[:4], None) == FIRST
    assert chain_hashes(TOKENS, 4, None) == [FIRST, SECOND]
    assert chain_hashes(TOKENS, 4, "tenant-a") == [SALTED_FIRST, SALTED_SECOND]


def test_the_salt_is_an_extra_key_of_the_root_block_only() -> None:
    """vLLM adds `cache_salt` only for the block starting at token 0; the chain carries it onwards."""
    assert block_hash(SALTED_FIRST, TOKENS[4:], None) == SALTED_SECOND
    assert block_hash(SALTED_FIRST, TOKENS[4:], "tenant-a") != SALTED_SECOND


@pytest.mark.parametrize("salt", [None, ""])
def test_no_salt_and_an_empty_salt_hash_alike(salt: str | None) -> None:
    assert chain_hashes(TOKENS, 4, salt) == [FIRST, SECOND]


@pytest.mark.parametrize(
    ("length", "block_size", "blocks"),
    [(0, 16, 0), (15, 16, 0), (16, 16, 1), (31, 16, 1), (32, 16, 2), (1000, 16, 62), (7, 1, 7), (64, 64, 1)],
)
def test_only_full_blocks_are_hashed(length: int, block_size: int, blocks: int) -> None:
    assert len(chain_hashes(list(range(3, 3 + length)), block_size, None)) == blocks


def test_a_chain_continued_from_a_parent_equals_the_whole_chain() -> None:
    tokens = list(range(3, 3 + 80))
    whole = chain_hashes(tokens, 16, "s")
    assert chain_hashes(tokens, 16, "s", start_block=2, parent=whole[1]) == whole[2:]
    assert chain_hashes(tokens, 16, "s", start_block=5, parent=whole[4]) == []


def test_start_block_zero_ignores_the_parent_and_applies_the_salt() -> None:
    assert chain_hashes(TOKENS, 4, "tenant-a", start_block=0, parent=12345) == [SALTED_FIRST, SALTED_SECOND]


def test_a_missing_parent_for_a_later_block_falls_back_to_the_root() -> None:
    """Documented fallback: without `parent`, block 1 is hashed under the root value (so it differs)."""
    assert chain_hashes(TOKENS, 4, None, start_block=1) == [block_hash(ROOT, TOKENS[4:], None)]
    assert chain_hashes(TOKENS, 4, None, start_block=1) != [SECOND]


def test_a_changed_token_changes_its_block_and_every_later_block_only() -> None:
    tokens = list(range(3, 3 + 64))
    base = chain_hashes(tokens, 16, None)
    changed = tokens.copy()
    changed[20] += 1  # inside block 1
    other = chain_hashes(changed, 16, None)
    assert other[0] == base[0]
    assert all(a != b for a, b in zip(other[1:], base[1:], strict=True))


def test_token_order_and_block_boundaries_matter() -> None:
    assert block_hash(ROOT, [5, 6], None) != block_hash(ROOT, [6, 5], None)
    # The same 8 tokens split 4+4 and 2+2+2+2 end in different hashes (the chain structure differs).
    assert chain_hashes(TOKENS, 4, None)[-1] != chain_hashes(TOKENS, 2, None)[-1]


def test_salts_are_compared_as_text_and_are_prefix_free() -> None:
    """`\\x01` + salt for a salt, `\\x00` without, so salt "" (none), "a" and "a\\x00" all differ."""
    values = {block_hash(ROOT, [7], salt) for salt in (None, "a", "b", "a\x00", "ä", "A")}
    assert len(values) == 6


def test_token_ids_use_32_bits_and_larger_ones_are_refused() -> None:
    assert 0 <= block_hash(ROOT, [2**32 - 1], None) < 2**64
    with pytest.raises(Exception, match="format requires"):
        block_hash(ROOT, [2**32], None)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=31999), max_size=70),
    block_size=st.sampled_from([1, 4, 16]),
    salt=st.one_of(st.none(), st.text(min_size=1, max_size=8)),
    cut=st.integers(min_value=0, max_value=10),
)
def test_chain_properties(tokens: list[int], block_size: int, salt: str | None, cut: int) -> None:
    hashes = chain_hashes(tokens, block_size, salt)
    assert len(hashes) == len(tokens) // block_size
    assert all(0 <= h < 2**64 for h in hashes)
    # A prefix of the tokens hashes to a prefix of the chain (what prefix caching relies on).
    prefix = tokens[: cut * block_size]
    assert chain_hashes(prefix, block_size, salt) == hashes[: len(prefix) // block_size]
    # Continuing from any block reproduces the rest of the chain.
    if 0 < cut < len(hashes):
        assert chain_hashes(tokens, block_size, salt, cut, hashes[cut - 1]) == hashes[cut:]
