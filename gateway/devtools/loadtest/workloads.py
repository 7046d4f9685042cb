"""Reuse workloads for `kvgate plan`: request streams with a known reuse structure, replayable on any stack.

Three shapes, each seeded, sized in tokens and paced at a rate:

- `hot_set`: a bounded set of reference documents reopened again and again, mixed with a stream of one-off
  uploads that never return (`one_off_share` of the requests). A tier the size of the hot set pays; more only
  stores one-offs.
- `zipf`: `docs` documents, the k-th most popular asked about with probability ∝ 1/k^alpha. The benefit of more
  RAM falls off gradually.
- `chat`: conversations whose prompt grows by a reply and a user turn each time; several are open at once and
  take turns, so earlier turns must survive the others' traffic to be reused.

Every prompt is `document + question` (or `history + turn`) in token ids, so lengths are exact on any tokenizer
and the same on every run. Ids are drawn from [3, vocab_size), clear of the special tokens.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.devtools.loadtest.prompts import token_prompt


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HotSetWorkload(Strict):
    kind: Literal["hot_set"] = "hot_set"
    hot_docs: int = Field(default=8, gt=0)
    doc_tokens: int = Field(default=1024, gt=0)
    one_off_share: float = Field(default=0.5, ge=0, lt=1)
    one_off_tokens: int = Field(default=1024, gt=0)
    question_tokens: int = Field(default=40, ge=0)


class ZipfWorkload(Strict):
    kind: Literal["zipf"] = "zipf"
    docs: int = Field(default=64, gt=0)
    doc_tokens: int = Field(default=1024, gt=0)
    alpha: float = Field(default=1.0, gt=0)
    question_tokens: int = Field(default=40, ge=0)


class ChatWorkload(Strict):
    kind: Literal["chat"] = "chat"
    system_tokens: int = Field(default=256, ge=0)
    open_chats: int = Field(default=6, gt=0)  # conversations taking turns at any time
    turns: int = Field(default=8, gt=0)  # user turns per conversation, then it is replaced by a new one
    user_tokens: int = Field(default=96, gt=0)
    reply_tokens: int = Field(default=64, ge=0)


Shape = Annotated[HotSetWorkload | ZipfWorkload | ChatWorkload, Field(discriminator="kind")]


class WorkloadSpec(Strict):
    shape: Shape
    format: Literal["tokens", "text", "chat"] = "tokens"
    """tokens: /v1/completions with token ids (exact lengths); text: /v1/completions with the same prompts as
    words; chat: /v1/chat/completions with one message per segment (document, question, turns)."""
    requests: int = Field(default=200, gt=0)
    rate: float = Field(default=0.0, ge=0)  # requests per second; 0: one after another, as fast as answered
    seed: int = 7
    vocab_size: int = Field(default=32000, gt=16)


Segment = tuple[str, list[int]]  # (chat role, token ids)


@dataclass(frozen=True)
class WorkloadRequest:
    index: int
    label: str  # what the prompt is (doc-3, one-off-17, chat-2-turn-4), for reports; never sent
    segments: list[Segment]

    @property
    def prompt(self) -> list[int]:
        return [token for _, tokens in self.segments for token in tokens]


def generate(spec: WorkloadSpec) -> Iterator[WorkloadRequest]:
    """The workload's requests in order; the same spec always gives the same prompts."""
    rng = random.Random(spec.seed)
    shape = spec.shape
    if isinstance(shape, HotSetWorkload):
        stream = _hot_set(spec, shape, rng)
    elif isinstance(shape, ZipfWorkload):
        stream = _zipf(spec, shape, rng)
    else:
        stream = _chat(spec, shape, rng)
    for index, (label, segments) in enumerate(stream):
        if index >= spec.requests:
            return
        yield WorkloadRequest(index, label, segments)


def _tokens(spec: WorkloadSpec, length: int, *key: object) -> list[int]:
    return token_prompt(spec.seed, spec.vocab_size, length, *key)


def _hot_set(spec: WorkloadSpec, shape: HotSetWorkload, rng: random.Random) -> Iterator[tuple[str, list[Segment]]]:
    docs = [_tokens(spec, shape.doc_tokens, "hot", i) for i in range(shape.hot_docs)]
    index = 0
    while True:
        question = _tokens(spec, shape.question_tokens, "question", index)
        if rng.random() < shape.one_off_share:
            yield f"one-off-{index}", [("system", _tokens(spec, shape.one_off_tokens, "one-off", index)),
                                       ("user", question)]
        else:
            doc = rng.randrange(shape.hot_docs)
            yield f"hot-{doc}", [("system", docs[doc]), ("user", question)]
        index += 1


def _zipf(spec: WorkloadSpec, shape: ZipfWorkload, rng: random.Random) -> Iterator[tuple[str, list[Segment]]]:
    weights = [1.0 / (rank + 1) ** shape.alpha for rank in range(shape.docs)]
    docs: dict[int, list[int]] = {}
    index = 0
    while True:
        doc = rng.choices(range(shape.docs), weights)[0]
        if doc not in docs:
            docs[doc] = _tokens(spec, shape.doc_tokens, "doc", doc)
        yield f"doc-{doc}", [("system", docs[doc]), ("user", _tokens(spec, shape.question_tokens, "question", index))]
        index += 1


def _chat(spec: WorkloadSpec, shape: ChatWorkload, rng: random.Random) -> Iterator[tuple[str, list[Segment]]]:
    system: list[Segment] = [("system", _tokens(spec, shape.system_tokens, "system"))] if shape.system_tokens else []
    histories: list[list[Segment]] = []
    turns: list[int] = []
    ids: list[int] = []
    next_chat = 0
    while True:
        while len(histories) < shape.open_chats:
            histories.append(list(system))
            turns.append(0)
            ids.append(next_chat)
            next_chat += 1
        slot = rng.randrange(len(histories))
        chat, turn = ids[slot], turns[slot]
        segments = [*histories[slot], ("user", _tokens(spec, shape.user_tokens, "user", chat, turn))]
        yield f"chat-{chat}-turn-{turn}", segments
        reply = [("assistant", _tokens(spec, shape.reply_tokens, "reply", chat, turn))] if shape.reply_tokens else []
        histories[slot] = segments + reply
        turns[slot] += 1
        if turns[slot] >= shape.turns:
            del histories[slot], turns[slot], ids[slot]


SYLLABLES = tuple(c + v for c in "bdfgklmnprstvz" for v in "aeiou")


def words(tokens: list[int]) -> str:
    """Token ids as words, one word per id and a different word for every id, for the text and chat formats."""
    return " ".join(_word(token) for token in tokens)


def _word(token: int) -> str:
    # The id's base-70 digits as consonant-vowel syllables, least significant first. Every syllable is two letters,
    # so a word splits into its digits one way only, and the digits sum back to the id: distinct ids, distinct
    # words, however large the vocabulary. Ids divisible by 3 carry one more zero digit ("ba"), so word lengths
    # vary without changing what they spell.
    if token < 0:
        raise ValueError(f"token id {token} is negative")
    digits: list[str] = []
    rest = token
    while rest or len(digits) < (3 if token % 3 == 0 else 2):
        rest, digit = divmod(rest, len(SYLLABLES))
        digits.append(SYLLABLES[digit])
    return "".join(digits)


def request_body(
    request: WorkloadRequest, spec: WorkloadSpec, model: str, max_tokens: int
) -> tuple[str, dict[str, Any]]:
    """The route and JSON body of one workload request in the spec's format."""
    common: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0}
    if spec.format == "tokens":
        return "/v1/completions", {**common, "prompt": request.prompt}
    if spec.format == "text":
        return "/v1/completions", {**common, "prompt": "\n".join(words(tokens) for _, tokens in request.segments)}
    messages = [{"role": role, "content": words(tokens)} for role, tokens in request.segments]
    return "/v1/chat/completions", {**common, "messages": messages}
