"""Generated text: a function of the prompt tokens (and seed) for deterministic requests, random otherwise.

Output is lower-case pseudo-words separated by spaces, one byte token per character, so the generated text
re-tokenizes to the same ids (a follow-up chat turn that contains it reuses its cached blocks). With
`--corrupt-output` a deterministic request yields a different text than a correct simulator would.
"""

from __future__ import annotations

import hashlib
import random
import struct
from collections.abc import Sequence

from gateway.sim import tokenizer

_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "qu", "xi", "pa", "do", "fe", "gu", "hy")
_CORRUPT_SALT = b"kvgate-sim-corrupt"


class OutputGenerator:
    """Produces the generated token ids of a request."""

    def __init__(self, seed: int, corrupt: bool) -> None:
        self._random = random.Random(seed)
        self._corrupt = corrupt

    def tokens(self, prompt: Sequence[int], count: int, temperature: float | None, seed: int | None) -> list[int]:
        return tokenizer.encode(_text(self._stream_key(prompt, temperature, seed), count))

    def _stream_key(self, prompt: Sequence[int], temperature: float | None, seed: int | None) -> int:
        label = _determinism_label(temperature, seed)
        if label is None:
            return self._random.getrandbits(64)
        digest = hashlib.sha256(label)
        digest.update(struct.pack(f"<{len(prompt)}I", *prompt))
        if self._corrupt:
            digest.update(_CORRUPT_SALT)
        return int.from_bytes(digest.digest()[:8], "big")


def _determinism_label(temperature: float | None, seed: int | None) -> bytes | None:
    """What makes a request deterministic: greedy decoding, else a seed; None when neither."""
    if temperature == 0:
        return b"greedy"
    return None if seed is None else b"seed:%d" % seed


def _text(key: int, count: int) -> str:
    """`count` characters of space-separated pseudo-words drawn from a generator seeded with `key`."""
    rng = random.Random(key)
    parts: list[str] = []
    length = 0
    while length < count:
        word = " " + "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
        parts.append(word)
        length += len(word)
    return "".join(parts)[:count]
