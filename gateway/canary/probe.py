"""What one canary probe sends and how its answer is judged. Pure.

A probe sends a fresh random prefix twice to one upstream: first under canary identity A, then under canary
identity B. Both identities exist only for the canary (their names cannot be tenant names), so no real
tenant's cache is read or written. B must see 0 cached prompt tokens; where the upstream's /metrics counts
external-cache hits, B's request must not raise that count either.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.connectors.lmcache_tags import lmcache_params
from gateway.connectors.metrics_text import sum_samples
from gateway.policy.model import OffloadPolicy, PoolConfig
from gateway.salts import derive_salt

# Not valid tenant names (policy/model.py TENANT_NAME), so never a real tenant's salt or tag.
IDENTITY_A = "~canary-a"
IDENTITY_B = "~canary-b"
CANARY_EPOCH = 0
WORDS_PER_TOKEN = 2  # hex words of 6 characters are 2-3 tokens for BPE tokenizers, 7 for byte-level ones


class Result(StrEnum):
    PASS = "pass"  # noqa: S105 (a result name, not a secret). B saw nothing cached and no external hit was counted for it
    FAIL = "fail"  # B was served (part of) A's prefix: isolation is broken on this upstream
    INCONCLUSIVE = "inconclusive"  # B saw 0 cached, but external hits rose meanwhile (other traffic?)
    ERROR = "error"  # a request failed; nothing is known


RESULTS = tuple(Result)


@dataclass(frozen=True)
class Probe:
    prompt: str
    model: str

    def body(self, identity: str, secret: bytes, pool: PoolConfig) -> dict[str, Any]:
        salt = derive_salt(secret, identity, CANARY_EPOCH)
        body: dict[str, Any] = {"model": self.model, "prompt": self.prompt, "max_tokens": 1, "temperature": 0,
                                "cache_salt": salt}
        if pool.lmcache:
            body["kv_transfer_params"] = lmcache_params(secret, salt, OffloadPolicy(), {})
        return body


@dataclass(frozen=True)
class Outcome:
    pool: str
    upstream: str
    result: Result
    cached_a: int | None = None
    cached_b: int | None = None
    external_hits_delta: float | None = None  # None: the upstream's /metrics has no such counter
    detail: str = ""
    at: float = 0.0

    def view(self) -> dict[str, Any]:
        return {"pool": self.pool, "upstream": self.upstream, "result": str(self.result),
                "cached_tokens_a": self.cached_a, "cached_tokens_b": self.cached_b,
                "external_hits_delta_b": self.external_hits_delta, "detail": self.detail, "at": self.at}


def random_prefix(tokens: int) -> str:
    """About `tokens` tokens of text no one else will send (random per probe)."""
    return " ".join(secrets.token_hex(3) for _ in range(max(tokens // WORDS_PER_TOKEN, 1)))


def judge(cached_b: int, external_delta: float | None) -> Result:
    if cached_b > 0:
        return Result.FAIL
    if external_delta is not None and external_delta > 0:
        return Result.INCONCLUSIVE
    return Result.PASS


EXTERNAL_HIT_FAMILIES = ("vllm:external_prefix_cache_hits_total", "lmcache:num_hit_tokens_total")


def external_hits(metrics_text: str) -> float | None:
    """Sum of the external-cache hit counters in a /metrics page; None when it has none of them."""
    return sum_samples(metrics_text, EXTERNAL_HIT_FAMILIES)
