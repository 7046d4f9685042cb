"""The bytes each fingerprint covers, pinned to their definition: token ids as 4-byte little-endian words (8-byte
words with a sentinel for a chunk holding an id that is not a 32-bit token id, that chunk alone), and a text
prompt's first chunk cut from its pieces without depending on how the prompt was split into pieces."""

from __future__ import annotations

import struct

import pytest

from gateway.reuse.fingerprint import PromptParts, _ids_bytes, canonical_parts, token_chunks

SENTINEL = 2**64 - 1


@pytest.mark.parametrize("ids", [[], [0], [1, 2, 3], [2**32 - 1, 7], [True, False], list(range(0, 200_000, 997))])
def test_32_bit_ids_are_4_byte_little_endian_words(ids: list[int]) -> None:
    assert _ids_bytes(ids) == struct.pack(f"<{len(ids)}I", *ids)


@pytest.mark.parametrize(("ids", "words"), [
    ([1, 2**32], [1, 2**32]),
    ([5, -1], [5, SENTINEL]),
    ([5, 1.0], [5, SENTINEL]),
    ([5, "7"], [5, SENTINEL]),
    ([5, None], [5, SENTINEL]),
    ([2**64, 3], [SENTINEL, 3]),
])
def test_any_id_that_is_not_a_32_bit_token_id_makes_every_word_of_its_chunk_8_bytes(ids: list[object],
                                                                                    words: list[int]) -> None:
    assert _ids_bytes(ids) == struct.pack(f"<{len(words)}Q", *words)


@pytest.mark.parametrize(("odd", "word"), [(2**32, 2**32), (-1, SENTINEL), (1.0, SENTINEL), ("7", SENTINEL),
                                           (None, SENTINEL)])
def test_a_chunk_s_bytes_depend_on_its_own_ids_alone(odd: object, word: int) -> None:
    """Two prompts that share whole blocks share their bytes, whatever a later block holds: the chain of a long
    token-id list can then be built a piece of the list at a time."""
    chunks = token_chunks([1, 2, 3, 4, 5, odd, 7, 8, 9], 3, 10)
    assert chunks == [struct.pack("<3I", 1, 2, 3), struct.pack("<3Q", 4, 5, word), struct.pack("<3I", 7, 8, 9)]


@pytest.mark.parametrize("units", [0, 1, 5, 6, 7, 12, 13, 40, 1000])
def test_the_head_is_the_first_units_of_the_whole_prompt(units: int) -> None:
    parts = canonical_parts({"messages": [{"role": "system", "content": "short"},
                                          {"role": "user", "content": "a much longer message " * 3}]})
    assert parts is not None
    whole = parts.whole()
    assert isinstance(whole, str)
    assert parts.head(units) == whole[:units]
    assert PromptParts(None, ("", "ab", "", "cdef")).head(units) == "abcdef"[:units]
