"""Deterministic prompts as token ids: exact lengths on any tokenizer, the same bytes on both arms.

Ids are drawn from [3, vocab_size) so no special token (0-2 on the captured model and the simulator) appears.
"""

from __future__ import annotations

import hashlib
import random


def token_prompt(seed: int, vocab_size: int, length: int, *key: object) -> list[int]:
    """`length` token ids that depend only on (seed, key): repeat a key to repeat the prompt."""
    material = ":".join(str(part) for part in (seed, *key)).encode()
    rng = random.Random(int.from_bytes(hashlib.sha256(material).digest()[:8], "big"))
    return [rng.randrange(3, vocab_size) for _ in range(length)]


class PromptBook:
    """The scenario's prompts by role: a tenant's prefix per repetition, the pressure set, probes."""

    def __init__(self, seed: int, vocab_size: int, prefix_tokens: int, pressure_tokens: int) -> None:
        self.seed = seed
        self.vocab_size = vocab_size
        self.prefix_tokens = prefix_tokens
        self.pressure_tokens = pressure_tokens

    def prefix(self, tenant: str, rep: int) -> list[int]:
        return token_prompt(self.seed, self.vocab_size, self.prefix_tokens, "prefix", tenant, rep)

    def pressure(self, rep: int, index: int) -> list[int]:
        return token_prompt(self.seed, self.vocab_size, self.pressure_tokens, "pressure", rep, index)

    def probe(self, label: str) -> list[int]:
        """A short prompt for warming a fresh server; it fills two GPU blocks, so it emits a KV event."""
        return token_prompt(self.seed, self.vocab_size, 32, "probe", label)

    def overhead(self, index: int, route: str) -> list[int]:
        """A fresh prefix-length prompt for the direct-vs-gateway baseline (never cached anywhere)."""
        return token_prompt(self.seed, self.vocab_size, self.prefix_tokens, "overhead", index, route)
