"""The hot-plus-scan workload: a hot set H of documents that keeps returning, and one-off documents.

Each round sends every hot document once, each after `scan_ratio` one-off documents of the same length, so the
one-offs are `scan_ratio` times H's volume and every hot return follows enough scan traffic to push it out of a
GPU cache smaller than that. A request is its document followed by a short question that changes every time
(the document is the reusable prefix, the question is not). Prompts are token ids, so lengths are exact on any
tokenizer, and depend only on (seed, document), so both arms send the same bytes.

This module is pure: the sequence of requests, and the summaries of what came back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.devtools.loadtest.prompts import token_prompt
from gateway.shadow.stats import quantile

Role = Literal["hot", "scan"]


@dataclass(frozen=True)
class HotScan:
    hot_docs: int = 3
    doc_tokens: int = 1024
    scan_ratio: int = 10
    rounds: int = 5
    question_tokens: int = 16
    vocab_size: int = 32000
    seed: int = 1

    @property
    def hot_tokens(self) -> int:
        """H: the hot set's size in document tokens."""
        return self.hot_docs * self.doc_tokens


@dataclass(frozen=True)
class Request:
    role: Role
    round: int
    doc: str  # `hot-<i>` or `scan-<round>-<i>`
    prompt: list[int]


def requests(spec: HotScan) -> list[Request]:
    """Every request of the run, in order."""
    out: list[Request] = []
    counter = 0
    for round_number in range(spec.rounds):
        for hot in range(spec.hot_docs):
            for scan in range(spec.scan_ratio):
                doc = f"scan-{round_number}-{hot * spec.scan_ratio + scan}"
                out.append(Request("scan", round_number, doc, _prompt(spec, doc, counter)))
                counter += 1
            out.append(Request("hot", round_number, f"hot-{hot}", _prompt(spec, f"hot-{hot}", counter)))
            counter += 1
    return out


def _prompt(spec: HotScan, doc: str, counter: int) -> list[int]:
    document = token_prompt(spec.seed, spec.vocab_size, spec.doc_tokens, "doc", doc)
    question = token_prompt(spec.seed, spec.vocab_size, spec.question_tokens, "question", counter)
    return document + question


@dataclass
class Answer:
    """What came back for one request (CPU-tier tokens from the server's own record when it keeps one)."""

    role: Role
    round: int
    doc: str
    status: int
    ttft_s: float | None
    prompt_tokens: int | None
    cached_tokens: int | None
    cpu_loaded_tokens: int | None = None  # the simulator's record; None against real vLLM
    request_id: str | None = None
    error: str | None = None


@dataclass
class ArmSummary:
    name: str
    requests: int
    errors: int
    hot_returns: int
    hot_cpu_hit_share: float | None  # CPU-loaded tokens / prompt tokens of hot returns (None: not known)
    hot_cached_share: float | None  # cached tokens (GPU or CPU) / prompt tokens of hot returns
    hot_return_ttft_p50_s: float | None
    scan_ttft_p50_s: float | None
    upstream_delta: dict[str, float] = field(default_factory=dict)
    # CPU-loaded bytes / (KV bytes per token x hot returns' prompt tokens): the same share seen from the server's
    # load counter (one-off documents are never in the tier, so every load is a hot return's)
    hot_cpu_hit_share_from_load_bytes: float | None = None
    gateway_counters: dict[str, float] = field(default_factory=dict)  # admission decisions, miss-path retries

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def hot_returns(answers: Sequence[Answer]) -> list[Answer]:
    """Hot requests after the first round: the ones whose prefix could have been kept."""
    return [answer for answer in answers if answer.role == "hot" and answer.round > 0]


def summarise(name: str, answers: Sequence[Answer], upstream_delta: dict[str, float],
              kv_bytes_per_token: int | None = None) -> ArmSummary:
    returns = hot_returns(answers)
    prompt = sum(answer.prompt_tokens or 0 for answer in returns)
    loaded = [answer.cpu_loaded_tokens for answer in returns]
    cpu_share = (sum(v for v in loaded if v is not None) / prompt) if prompt and None not in loaded else None
    cached_share = sum(answer.cached_tokens or 0 for answer in returns) / prompt if prompt else None
    ttfts = [answer.ttft_s for answer in returns if answer.ttft_s is not None]
    scan_ttfts = [a.ttft_s for a in answers if a.role == "scan" and a.ttft_s is not None]
    loaded_bytes = upstream_delta.get("vllm:kv_offload_load_bytes_total")
    from_bytes = (loaded_bytes / (kv_bytes_per_token * prompt)
                  if kv_bytes_per_token and prompt and loaded_bytes is not None else None)
    return ArmSummary(name, len(answers), sum(1 for a in answers if a.status != 200 or a.error), len(returns),
                      cpu_share, cached_share, quantile(ttfts, 0.5), quantile(scan_ttfts, 0.5), upstream_delta,
                      from_bytes)
