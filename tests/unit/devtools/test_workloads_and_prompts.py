"""Deterministic prompts and reuse workloads (gateway.devtools.loadtest.prompts and .workloads): exact lengths,
the id range, repeatability, the reuse structure of each shape, and the request bodies of each format."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.devtools.loadtest.prompts import PromptBook, token_prompt
from gateway.devtools.loadtest.workloads import (
    ChatWorkload,
    HotSetWorkload,
    WorkloadRequest,
    WorkloadSpec,
    ZipfWorkload,
    generate,
    request_body,
    words,
)


@given(st.integers(0, 2**32), st.integers(4, 50_000), st.integers(0, 300), st.text(max_size=8))
@settings(max_examples=50, deadline=None)
def test_token_prompts_have_the_exact_length_and_no_special_ids(seed: int, vocab: int, length: int, key: str) -> None:
    prompt = token_prompt(seed, vocab, length, key)
    assert len(prompt) == length
    assert all(3 <= token < vocab for token in prompt)
    assert prompt == token_prompt(seed, vocab, length, key)


def test_a_vocabulary_of_four_leaves_only_id_three() -> None:
    assert token_prompt(1, 4, 5, "k") == [3, 3, 3, 3, 3]


def test_prompts_depend_on_the_seed_and_every_key_part() -> None:
    base = token_prompt(1, 32000, 64, "prefix", "acme", 0)
    assert base != token_prompt(2, 32000, 64, "prefix", "acme", 0)
    assert base != token_prompt(1, 32000, 64, "prefix", "acme", 1)
    assert base != token_prompt(1, 32000, 64, "prefix", "beta", 0)
    assert base != token_prompt(1, 32000, 64, "pressure", "acme", 0)
    assert token_prompt(1, 32000, 8, "k") == token_prompt(1, 32000, 64, "k")[:8]  # longer extends, same start


def test_the_prompt_book_gives_each_role_its_length_and_keeps_roles_apart() -> None:
    book = PromptBook(seed=7, vocab_size=1000, prefix_tokens=100, pressure_tokens=300)
    assert [len(book.prefix("acme", 0)), len(book.pressure(0, 0)), len(book.probe("x")),
            len(book.overhead(0, "direct"))] == [100, 300, 32, 100]
    assert book.prefix("acme", 0) == book.prefix("acme", 0)
    prompts = [book.prefix("acme", 0), book.prefix("acme", 1), book.prefix("beta", 0), book.pressure(0, 0)[:100],
               book.pressure(0, 1)[:100], book.overhead(0, "direct"), book.overhead(0, "gateway"),
               book.overhead(1, "direct")]
    assert len({tuple(p) for p in prompts}) == len(prompts)


# -- workloads ------------------------------------------------------------------------------------------------


def _spec(shape: Any, **fields: Any) -> WorkloadSpec:
    return WorkloadSpec(shape=shape, **fields)


def test_a_workload_yields_exactly_its_request_count_with_indices_in_order() -> None:
    requests = list(generate(_spec(ZipfWorkload(docs=3), requests=17)))
    assert [r.index for r in requests] == list(range(17))


@pytest.mark.parametrize("shape", [HotSetWorkload(), ZipfWorkload(), ChatWorkload()], ids=lambda s: s.kind)
def test_the_same_spec_gives_the_same_requests(shape: Any) -> None:
    spec = _spec(shape, requests=30, seed=3)
    assert list(generate(spec)) == list(generate(spec))
    assert [r.label for r in generate(spec)] != [r.label for r in generate(_spec(shape, requests=30, seed=4))]


def test_hot_set_documents_repeat_and_one_offs_never_do() -> None:
    shape = HotSetWorkload(hot_docs=3, doc_tokens=20, one_off_share=0.5, one_off_tokens=12, question_tokens=4)
    requests = list(generate(_spec(shape, requests=200)))
    hot = [r for r in requests if r.label.startswith("hot-")]
    one_off = [r for r in requests if r.label.startswith("one-off-")]
    assert len(hot) + len(one_off) == 200 and 60 < len(one_off) < 140
    assert {r.label for r in hot} == {"hot-0", "hot-1", "hot-2"}
    by_label: dict[str, set[tuple[int, ...]]] = {}
    for request in hot:
        role, document = request.segments[0]
        assert role == "system" and len(document) == 20
        by_label.setdefault(request.label, set()).add(tuple(document))
    assert all(len(documents) == 1 for documents in by_label.values())  # a hot document is always the same
    assert len({tuple(r.segments[0][1]) for r in one_off}) == len(one_off)  # a one-off never returns
    assert all(len(r.segments[0][1]) == 12 and len(r.segments[1][1]) == 4 for r in one_off)
    assert all(r.prompt == r.segments[0][1] + r.segments[1][1] for r in requests)


def test_a_hot_set_without_one_offs_only_reopens_documents() -> None:
    labels = [r.label for r in generate(_spec(HotSetWorkload(hot_docs=2, one_off_share=0.0), requests=50))]
    assert set(labels) <= {"hot-0", "hot-1"}


def test_zipf_popularity_falls_with_rank() -> None:
    counts = Counter(r.label for r in generate(_spec(ZipfWorkload(docs=5, doc_tokens=4, alpha=2.0), requests=2000)))
    ranked = [counts[f"doc-{k}"] for k in range(5)]
    assert ranked == sorted(ranked, reverse=True)
    assert ranked[0] > 0.5 * 2000  # 1 / sum(1/k^2, k=1..5) = 68 % expected for the first
    only = {r.label for r in generate(_spec(ZipfWorkload(docs=1), requests=10))}
    assert only == {"doc-0"}


def test_a_chat_grows_by_a_reply_and_a_turn_then_is_replaced() -> None:
    """One open chat of 3 turns, no system prompt, 5-token turns and 2-token replies: prompt lengths 5, 12, 19,
    then a new chat starts at 5; each turn's prompt extends the previous one by its reply and a new turn."""
    shape = ChatWorkload(system_tokens=0, open_chats=1, turns=3, user_tokens=5, reply_tokens=2)
    requests = list(generate(_spec(shape, requests=6)))
    assert [r.label for r in requests] == ["chat-0-turn-0", "chat-0-turn-1", "chat-0-turn-2", "chat-1-turn-0",
                                           "chat-1-turn-1", "chat-1-turn-2"]
    assert [len(r.prompt) for r in requests] == [5, 12, 19, 5, 12, 19]
    assert [role for role, _ in requests[2].segments] == ["user", "assistant", "user", "assistant", "user"]
    assert requests[1].prompt[:5] == requests[0].prompt and requests[2].prompt[:12] == requests[1].prompt
    assert requests[3].prompt != requests[0].prompt


def test_open_chats_share_the_system_prompt_and_take_turns() -> None:
    shape = ChatWorkload(system_tokens=8, open_chats=3, turns=4, user_tokens=2, reply_tokens=0)
    requests = list(generate(_spec(shape, requests=40)))
    systems = {tuple(r.segments[0][1]) for r in requests}
    assert len(systems) == 1 and all(r.segments[0][0] == "system" for r in requests)
    turns: dict[str, list[int]] = {}
    for request in requests:
        _, chat, _, turn = request.label.split("-")
        turns.setdefault(chat, []).append(int(turn))
    assert all(seen == list(range(len(seen))) and len(seen) <= 4 for seen in turns.values())
    assert len(turns) >= 10  # 40 requests of at most 4 turns each


@pytest.mark.parametrize(("shape", "field"), [
    ({"kind": "hot_set", "one_off_share": 1.0}, "one_off_share"),
    ({"kind": "hot_set", "hot_docs": 0}, "hot_docs"),
    ({"kind": "zipf", "alpha": 0}, "alpha"),
    ({"kind": "chat", "turns": 0}, "turns"),
    ({"kind": "chat", "user_tokens": 0}, "user_tokens"),
    ({"kind": "poisson"}, "shape"),
    ({"kind": "zipf", "doc_tokns": 5}, "doc_tokns"),
])
def test_invalid_workloads_are_refused_naming_the_field(shape: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        WorkloadSpec.model_validate({"shape": shape})


@pytest.mark.parametrize(("fields", "field"), [
    ({"requests": 0}, "requests"), ({"rate": -1}, "rate"), ({"format": "xml"}, "format"),
    ({"vocab_size": 10}, "vocab_size"),
])
def test_invalid_replay_settings_are_refused(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        WorkloadSpec.model_validate({"shape": {"kind": "zipf"}, **fields})


# -- words and bodies -----------------------------------------------------------------------------------------


def test_words_are_one_per_id_and_the_same_for_the_same_id() -> None:
    assert words([]) == ""
    text = words([3, 4, 3, 70 * 70 + 3, 31999])
    parts = text.split(" ")
    assert len(parts) == 5 and parts[0] == parts[2] and parts[0] != parts[1]
    assert all(part.isalpha() and part.isascii() for part in parts)
    assert len(set(words([token]) for token in range(3, 3000))) == 2997  # distinct ids, distinct words


# The independent oracle: consonants then vowels, as letters, and a word read back as base-70 digits, least
# significant first.
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"


def read_word(word: str) -> int:
    assert len(word) % 2 == 0 and len(word) >= 4, word
    value = 0
    for place, start in enumerate(range(0, len(word), 2)):
        consonant, vowel = word[start], word[start + 1]
        value += (CONSONANTS.index(consonant) * len(VOWELS) + VOWELS.index(vowel)) * 70**place
    return value


def test_every_id_below_400_000_has_its_own_word() -> None:
    """Every id of any vocabulary up to 400,000 (the default 32,000, 151,936 and 256,000 ones included, and both
    base-70 digit boundaries, 4,900 and 343,000). Wrong version: two syllables from id mod 70 and id // 70 mod 70,
    where 4,900 and 0 share a word."""
    ids = range(400_000)
    spelt = words(list(ids)).split(" ")
    assert len(spelt) == len(ids) and len(set(spelt)) == len(ids)


@given(st.integers(0, 2**48))
@settings(max_examples=300, deadline=None)
def test_a_word_reads_back_as_its_id(token: int) -> None:
    (word,) = words([token]).split(" ")
    assert word.isalpha() and word.isascii()
    assert read_word(word) == token


def test_a_negative_id_is_refused() -> None:
    with pytest.raises(ValueError, match="negative"):
        words([-1])


REQUEST = WorkloadRequest(0, "doc-0", [("system", [10, 11]), ("user", [12])])


def test_token_bodies_carry_the_ids() -> None:
    route, body = request_body(REQUEST, _spec(ZipfWorkload()), "m", 3)
    assert route == "/v1/completions"
    assert body == {"model": "m", "max_tokens": 3, "temperature": 0, "prompt": [10, 11, 12]}


def test_text_bodies_put_one_line_per_segment() -> None:
    route, body = request_body(REQUEST, _spec(ZipfWorkload(), format="text"), "m", 1)
    assert route == "/v1/completions"
    assert body["prompt"] == f"{words([10, 11])}\n{words([12])}"


def test_chat_bodies_put_one_message_per_segment() -> None:
    route, body = request_body(REQUEST, _spec(ZipfWorkload(), format="chat"), "m", 1)
    assert route == "/v1/chat/completions" and "prompt" not in body
    assert body["messages"] == [{"role": "system", "content": words([10, 11])},
                                {"role": "user", "content": words([12])}]
