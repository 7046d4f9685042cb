"""The simulator's byte-level tokenizer and chat template (pure): ids, round trips, specials, vocabulary edges."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim import tokenizer
from gateway.sim.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    VOCAB_SIZE,
    apply_chat_template,
    decode,
    encode,
    first_out_of_vocab,
    token_text,
)


@pytest.mark.parametrize(
    ("text", "ids"),
    [
        ("", []),
        ("a", [100]),  # ord("a") = 97, ids are byte + 3
        ("\x00", [3]),  # the lowest byte is the first byte id
        ("\xff", [198, 194]),  # U+00FF is two UTF-8 bytes: c3 bf
        ("é", [198, 172]),  # c3 a9
        ("€", [229, 133, 175]),  # e2 82 ac
        ("😀", [243, 162, 155, 131]),  # f0 9f 98 80: four bytes, four tokens
        ("a b\n", [100, 35, 101, 13]),
    ],
)
def test_encode_is_one_id_per_utf8_byte(text: str, ids: list[int]) -> None:
    assert encode(text) == ids
    assert decode(ids) == text


def test_byte_ids_span_exactly_3_to_258() -> None:
    assert decode(range(3, 3 + 128)) == "".join(chr(i) for i in range(128))  # every ASCII byte, in order
    assert encode("".join(chr(i) for i in range(128))) == list(range(3, 3 + 128))
    assert decode([3]) == "\x00"
    assert decode([258]) == "\ufffd"  # byte 0xff alone is not UTF-8
    assert decode([259]) == "<|t259|>"  # the first id without text of its own


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([ENDOFTEXT], "<|endoftext|>"),
        ([IM_START], "<|im_start|>"),
        ([IM_END], "<|im_end|>"),
        ([IM_START, 100, IM_END], "<|im_start|>a<|im_end|>"),
        ([VOCAB_SIZE - 1], f"<|t{VOCAB_SIZE - 1}|>"),
        ([1000, 1001], "<|t1000|><|t1001|>"),
        ([], ""),
    ],
)
def test_decode_of_specials_and_textless_ids(ids: list[int], text: str) -> None:
    assert decode(ids) == text


@pytest.mark.parametrize(
    ("ids", "text"),
    [
        ([198], "\ufffd"),  # a lead byte without its continuation
        ([198, IM_END, 172], "\ufffd<|im_end|>\ufffd"),  # a special splits a multi-byte character
        ([172], "\ufffd"),  # a lone continuation byte
        ([100, 198], "a\ufffd"),  # a truncated character at the end
    ],
)
def test_bytes_that_are_not_utf8_become_replacement_characters(ids: list[int], text: str) -> None:
    assert decode(ids) == text


def test_token_text_is_the_text_of_one_token() -> None:
    assert token_text(100) == "a"
    assert token_text(35) == " "
    assert token_text(IM_END) == "<|im_end|>"
    assert token_text(5000) == "<|t5000|>"


@pytest.mark.parametrize(
    ("ids", "first"),
    [
        ([], None),
        ([0, 1, 2, VOCAB_SIZE - 1], None),
        ([VOCAB_SIZE], VOCAB_SIZE),
        ([5, -1, VOCAB_SIZE], -1),  # the first offender is reported, not the largest
        ([5, 2**63], 2**63),
        ([VOCAB_SIZE + 7, -3], VOCAB_SIZE + 7),
    ],
)
def test_first_out_of_vocab(ids: list[int], first: int | None) -> None:
    assert first_out_of_vocab(ids) == first


def test_chat_template_of_one_message() -> None:
    tokens = apply_chat_template([("user", "hi")])
    expected = [IM_START, *encode("user\nhi"), IM_END, *encode("\n"), IM_START, *encode("assistant\n")]
    assert tokens == expected
    assert decode(tokens) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_without_the_generation_prompt_and_of_several_messages() -> None:
    conversation = [("system", "be brief"), ("user", "é"), ("assistant", "")]
    assert decode(apply_chat_template(conversation, add_generation_prompt=False)) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\né<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
    )
    assert apply_chat_template([], add_generation_prompt=False) == []
    assert decode(apply_chat_template([])) == "<|im_start|>assistant\n"


def test_chat_template_length_is_content_plus_a_fixed_overhead() -> None:
    """Per message: 2 specials + role + "\\n" + content + "\\n"; then 1 special + "assistant\\n" (10 bytes)."""
    conversation = [("user", "x" * 37), ("assistant", "yy")]
    per_message = [2 + len(role) + 1 + len(content) + 1 for role, content in conversation]
    assert len(apply_chat_template(conversation)) == sum(per_message) + 1 + 10


def test_a_conversation_is_a_prefix_of_its_continuation() -> None:
    """What makes a follow-up chat turn reuse its cached blocks: the earlier turns are a token prefix."""
    first = [("user", "question")]
    follow_up = [*first, ("assistant", "answer"), ("user", "more")]
    shared = apply_chat_template(first, add_generation_prompt=False)
    assert apply_chat_template(follow_up)[: len(shared)] == shared


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    tokens = encode(text)
    assert len(tokens) == len(text.encode())
    assert all(3 <= t <= 258 for t in tokens)
    assert decode(tokens) == text
    assert first_out_of_vocab(tokens) is None


_ASCII_OR_TEXTLESS = st.one_of(st.integers(0, 2), st.integers(3, 3 + 127), st.integers(259, VOCAB_SIZE - 1))


@settings(max_examples=100, deadline=None)
@given(st.lists(_ASCII_OR_TEXTLESS, max_size=40))
def test_ascii_and_textless_ids_decode_one_by_one(ids: list[int]) -> None:
    """Without multi-byte characters, decoding a sequence is decoding each id and joining."""
    assert decode(ids) == "".join(token_text(t) for t in ids)


def test_vocabulary_constants_match_the_captured_model() -> None:
    assert (tokenizer.VOCAB_SIZE, tokenizer.ENDOFTEXT, tokenizer.IM_START, tokenizer.IM_END) == (32000, 0, 1, 2)
