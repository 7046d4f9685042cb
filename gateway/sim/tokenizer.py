"""The simulator's deterministic byte-level tokenizer and its ChatML-style chat template.

Token ids:
- 0 `<|endoftext|>`, 1 `<|im_start|>`, 2 `<|im_end|>` (the specials of the captured model);
- 3 + b for each UTF-8 byte b of the text (ids 3..258), so one token per byte and an exact round trip;
- 259 .. VOCAB_SIZE-1 are valid ids without text of their own (a token-id prompt may use them, as with the
  captured 32000-token vocabulary); they decode to `<|tN|>`.

Chat template: for each message `<|im_start|>{role}\\n{content}<|im_end|>\\n`, then `<|im_start|>assistant\\n`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

VOCAB_SIZE = 32000
ENDOFTEXT, IM_START, IM_END = 0, 1, 2
BYTE_OFFSET = 3
_SPECIAL_TEXT = {ENDOFTEXT: "<|endoftext|>", IM_START: "<|im_start|>", IM_END: "<|im_end|>"}
_BYTE_LIMIT = BYTE_OFFSET + 256


def encode(text: str) -> list[int]:
    """Text to token ids: one id per UTF-8 byte."""
    return [b + BYTE_OFFSET for b in text.encode()]


def decode(tokens: Iterable[int]) -> str:
    """Token ids to text; bytes that do not form UTF-8 become U+FFFD."""
    out: list[str] = []
    pending = bytearray()
    for token in tokens:
        if BYTE_OFFSET <= token < _BYTE_LIMIT:
            pending.append(token - BYTE_OFFSET)
            continue
        out.append(pending.decode(errors="replace"))
        pending.clear()
        out.append(_SPECIAL_TEXT.get(token, f"<|t{token}|>"))
    out.append(pending.decode(errors="replace"))
    return "".join(out)


def token_text(token: int) -> str:
    """The text of one token as a stream delta (generated tokens are ASCII bytes)."""
    return decode((token,))


def first_out_of_vocab(tokens: Sequence[int]) -> int | None:
    """The first id outside the vocabulary, if any."""
    for token in tokens:
        if not 0 <= token < VOCAB_SIZE:
            return token
    return None


def apply_chat_template(messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of a conversation of (role, content) pairs."""
    tokens: list[int] = []
    for role, content in messages:
        tokens.append(IM_START)
        tokens.extend(encode(f"{role}\n{content}"))
        tokens.append(IM_END)
        tokens.extend(encode("\n"))
    if add_generation_prompt:
        tokens.append(IM_START)
        tokens.extend(encode("assistant\n"))
    return tokens
