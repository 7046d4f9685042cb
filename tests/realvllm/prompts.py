"""Prompts for the real-vLLM tier. Each one starts with a fresh tag, so no test ever hits a prefix that
another test (or an earlier run against the same server) cached."""

from __future__ import annotations

import uuid

WORDS = ("tenant", "cache", "gateway", "prompt", "block", "stream", "token", "policy", "salt", "server")


def long_prompt(items: int = 180) -> str:
    """Roughly 1,000 tokens of the tiny model's tokenizer at the default size (about 5.5 tokens per item)."""
    tag = uuid.uuid4().hex
    body = " ".join(f"{WORDS[(index * 7) % len(WORDS)]}{index}" for index in range(items))
    return f"[{tag}] {body}"


def short_prompt() -> str:
    return f"Say hello ({uuid.uuid4().hex[:8]})."
