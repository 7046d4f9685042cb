"""Prefix fingerprints: keyed hashes of a prompt in consecutive chunks of about one vLLM block.

Each fingerprint hashes the previous one together with its chunk, so two requests that share a prefix share exactly
the leading fingerprints of that prefix and nothing after the first difference — the same chaining vLLM uses for
its block hashes. The key is per tenant (derived from the salt secret), so fingerprints of two tenants never match
and a fingerprint reveals nothing about the text without the secret. No text is kept.

Token-id prompts chunk exactly by the block size, each chunk as 4-byte words (8-byte words for a chunk holding
anything but 32-bit ids). Text and chat prompts chunk a canonical rendering (UTF-8 of the prompt, chat messages as
role and content joined by separator bytes) every `block_size × chars_per_token` characters; `chars_per_token` is
the tenant's observed ratio, so a chunk is about one block.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import struct
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from gateway.proxy.rawprompt import CUT_MARK, exact_head

FINGERPRINT_BYTES = 8
DEFAULT_CHARS_PER_TOKEN = 4.0
MAX_CHUNKS = 4096  # a 256k-token prompt at 64-token blocks; longer prompts are fingerprinted up to here
# A token-id list kept as JSON text is decoded this many bytes at a time (about 2,000 ids, 0.1 ms on the 2-core
# box): decoded whole, 128k ids took 5-7 ms there, every other stream of the process waiting.
ID_PIECE_BYTES = 16 * 1024
ID_HEAD_BYTES = 12  # per id of the first block read from a kept list's head: ten digits, a comma and a space
_RECORD_SEPARATOR = "\x1e"
_UNIT_SEPARATOR = "\x1f"


def tenant_trace_key(secret: bytes, tenant: str) -> bytes:
    """The tenant's fingerprint key: independent of the salt epoch, so a trace spans `tenant forget` only by erasure."""
    return hmac.new(secret, f"kvgate-reuse-trace:{tenant}".encode(), hashlib.sha256).digest()


class PromptParts(msgspec.Struct, frozen=True):
    """A prompt without copying it: the request's own token-id list, or the pieces of the canonical string."""

    ids: list[int] | None
    texts: tuple[str, ...] = ()

    @property
    def units(self) -> int:
        """Tokens, or characters of the canonical string."""
        return len(self.ids) if self.ids is not None else sum(map(len, self.texts))

    def head(self, units: int) -> str | list[int]:
        """The first `units` tokens or characters."""
        if self.ids is not None:
            return self.ids[:units]
        pieces: list[str] = []
        left = units
        for text in self.texts:  # a slice of the piece that reaches `units`: a long prompt is not copied whole
            pieces.append(text if len(text) <= left else text[:left])
            left -= len(pieces[-1])
            if left <= 0:
                break
        return "".join(pieces)

    def whole(self) -> str | list[int]:
        return self.ids if self.ids is not None else "".join(self.texts)

    @property
    def is_text(self) -> bool:
        return self.ids is None


class KeptIds(msgspec.Struct, frozen=True):
    """A token-id prompt still as the request's JSON text (gateway.proxy.rawprompt kept it), with the ids of its
    first block read from its head: enough to sample it. The whole list is read in the reuse trace's background,
    a piece at a time (`id_pieces`), and only for a sampled request."""

    raw: msgspec.Raw
    first: list[int]  # the first block's ids

    @property
    def units(self) -> int:
        """At most this many ids (each but the last takes at least a digit and a comma): what the queue counts."""
        return (len(self.raw) + 1) // 2

    def head(self, units: int) -> list[int]:
        return self.first[:units]

    @property
    def is_text(self) -> bool:
        return False


def canonical_parts(request: dict[str, Any]) -> PromptParts | None:
    """The prompt of a generation request as token ids (when the client sent ids) or the pieces of one canonical
    string, at the cost of a few references (plus decoding a long prompt that the request kept as its JSON text)."""
    if "messages" in request:
        return _message_parts(_prompt_value(request["messages"]))
    for field in ("prompt", "input"):
        if field in request:
            return _prompt_parts(_prompt_value(request[field]))
    return None


def _prompt_value(value: object) -> object:
    """A prompt the rewrite kept as JSON text (gateway.proxy.rawprompt) is decoded when it is needed; one that
    cannot be (a number beyond float range, which the engine refuses) counts as no prompt."""
    if not isinstance(value, msgspec.Raw):
        return value
    try:
        return msgspec.json.decode(value)
    except msgspec.DecodeError:
        return None


def prompt_field(request: dict[str, Any]) -> str | None:
    """The field that carries the prompt, in the order canonical_parts reads them."""
    return next((name for name in ("messages", "prompt", "input") if name in request), None)


def kept_prompt_bytes(request: dict[str, Any]) -> int:
    """The length of the prompt's JSON text when the request kept it as text (gateway.proxy.rawprompt), else 0."""
    field = prompt_field(request)
    value = request[field] if field is not None else None
    return len(value) if isinstance(value, msgspec.Raw) else 0


def trace_parts(request: dict[str, Any], block_size: int) -> PromptParts | KeptIds | None:
    """The prompt as the reuse trace reads it once the reply is sent: a long token-id list from its head (decoded in
    the background, and only if the request is sampled), any other prompt with `canonical_parts`."""
    return kept_ids(request, block_size) or canonical_parts(request)


def kept_ids(request: dict[str, Any], block_size: int) -> KeptIds | None:
    """The prompt as `KeptIds` when it is a token-id list kept as JSON text whose head shows a whole first block;
    None otherwise (the caller then reads the prompt with `canonical_parts`)."""
    field = prompt_field(request)
    if field is None or field == "messages" or not _kept_list(request[field]):
        return None  # a kept text prompt is read by canonical_parts alone, not its head first
    found = exact_head_parts(request, block_size * ID_HEAD_BYTES + 64)
    if found is None:
        return None
    parts, exact = found
    if parts.ids is None or exact < block_size:
        return None
    return KeptIds(request[field], parts.ids[:block_size])


def _kept_list(value: object) -> bool:
    """A prompt kept as JSON text whose text is a list (msgspec.Raw starts at the value's first byte)."""
    return isinstance(value, msgspec.Raw) and memoryview(value)[:1].tobytes() == b"["


def parts_of(kept: KeptIds) -> PromptParts | None:
    """The whole list of a `KeptIds`, decoded at once (for a list `id_pieces` cannot cut)."""
    return _prompt_parts(_prompt_value(kept.raw))


def id_pieces(raw: msgspec.Raw) -> Iterator[list[object]] | None:
    """The items of a kept token-id list, decoded about ID_PIECE_BYTES of its text at a time (cut at commas, so
    each piece is whole items); None when the list holds a string, an object or a nested list, where a comma may
    not separate items (the caller then decodes it whole). Reaching a piece with a number that cannot be decoded
    (beyond float range) raises msgspec.DecodeError."""
    data = bytes(raw)
    opening = data.find(b"[")
    if opening < 0 or data.find(b"[", opening + 1) >= 0 or data.find(b"{") >= 0 or data.find(b'"') >= 0:
        return None
    return _pieces(data, opening + 1, data.rindex(b"]"))


def _pieces(data: bytes, start: int, end: int) -> Iterator[list[object]]:
    while start < end:
        cut = data.find(b",", start + ID_PIECE_BYTES, end)
        stop = cut if cut >= 0 else end
        yield msgspec.json.decode(b"[" + data[start:stop] + b"]", type=list)
        start = stop + 1


def exact_head_parts(request: dict[str, Any], size: int) -> tuple[PromptParts, int] | None:
    """The parts of the first `size` bytes of a prompt kept as JSON text, read without decoding the rest, and how
    many of their units are the whole prompt's (those before the cut); None for a prompt not kept as text or a
    head that cannot be read exactly (gateway.proxy.rawprompt.exact_head)."""
    field = prompt_field(request)
    value = request[field] if field is not None else None
    if not isinstance(value, msgspec.Raw):
        return None
    head = exact_head(value, size)
    if head is None:
        return None
    parts = _message_parts(head) if field == "messages" else _prompt_parts(head)
    if parts is None:
        return None
    if parts.ids is not None:
        return parts, len(parts.ids)  # a list cut between items: every id in it is whole
    exact = 0
    for text in parts.texts:
        mark = text.find(CUT_MARK)
        if mark >= 0:
            return parts, exact + mark
        exact += len(text)
    return parts, exact


def fingerprints(key: bytes, prompt: str | list[int], block_size: int, chars_per_token: float) -> list[bytes]:
    """The chained fingerprints of every whole chunk of the prompt (a partial last chunk is not cached by vLLM)."""
    return continued_chain(key, prompt_chunks(prompt, block_size, chars_per_token, MAX_CHUNKS))


def chunk_units(prompt: str | list[int], block_size: int, chars_per_token: float) -> int:
    """Tokens (token-id prompts) or characters (text prompts) per chunk."""
    return block_size if isinstance(prompt, list) else max(1, round(block_size * chars_per_token))


def prompt_chunks(prompt: str | list[int], block_size: int, chars_per_token: float, limit: int) -> list[bytes]:
    """The bytes of the first `limit` whole chunks: what each fingerprint covers."""
    size = chunk_units(prompt, block_size, chars_per_token)
    if isinstance(prompt, list):
        return token_chunks(prompt, size, limit)
    return _text_chunks(prompt, size, limit)


def continued_chain(key: bytes, chunks: Sequence[bytes], previous: bytes = b"") -> list[bytes]:
    """The fingerprints of `chunks` continuing a chain whose last fingerprint is `previous` (b"": a new chain); a
    chain hashed in parts equals the chain hashed at once."""
    # A keyed BLAKE2b state is set up once and copied per chunk: the same digests as hashing each
    # `previous + chunk` with the key, without redoing the key block for every chunk.
    keyed = hashlib.blake2b(digest_size=FINGERPRINT_BYTES, key=key[:64])
    out: list[bytes] = []
    for chunk in chunks:
        state = keyed.copy()
        state.update(previous)
        state.update(chunk)
        previous = state.digest()
        out.append(previous)
    return out


def token_chunks(tokens: Sequence[object], block_size: int, limit: int) -> list[bytes]:
    """The bytes of the first `limit` whole chunks of a token-id prompt. Each chunk's bytes depend on its own ids
    alone, so a chain can be built a piece of the list at a time, and two prompts sharing a prefix share its
    fingerprints whatever follows it."""
    whole = min(len(tokens) // block_size, limit)
    ids = tokens[: whole * block_size]
    words = _uint32_words(ids)
    if words is not None:  # the usual case: every item a 32-bit id, one conversion for the whole list
        step = block_size * 4
        return [words[i * step : (i + 1) * step] for i in range(whole)]
    return [_ids_bytes(ids[i * block_size : (i + 1) * block_size]) for i in range(whole)]


def _ids_bytes(ids: Sequence[object]) -> bytes:
    """One chunk's token ids as 4-byte little-endian words (8 bytes each when any id of the chunk needs more than
    32 bits; an item that is not a token id at all becomes 2**64 - 1, so it matches nothing a real prompt has)."""
    words = _uint32_words(ids)
    return words if words is not None else struct.pack(f"<{len(ids)}Q", *[_id_word(item) for item in ids])


def _uint32_words(ids: Sequence[object]) -> bytes | None:
    """4-byte little-endian words, or None when an item is over 32 bits, negative or not an integer."""
    try:
        words = array.array("I", ids)  # type: ignore[type-var]  # C unsigned int: 4 bytes everywhere
    except (TypeError, OverflowError):
        return None
    if words.itemsize != 4:
        return struct.pack(f"<{len(ids)}I", *ids)
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes()


def _id_word(item: object) -> int:
    return item if type(item) is int and 0 <= item < 2**64 else 2**64 - 1


def _text_chunks(text: str, chunk_chars: int, limit: int) -> list[bytes]:
    whole = min(len(text) // chunk_chars, limit)
    if text.isascii():  # one byte per character: encode once and slice
        data = text.encode("ascii")
        return [data[i * chunk_chars : (i + 1) * chunk_chars] for i in range(whole)]
    return [text[i * chunk_chars : (i + 1) * chunk_chars].encode("utf-8", "surrogatepass") for i in range(whole)]


def _prompt_parts(value: object) -> PromptParts | None:
    if isinstance(value, str):
        return PromptParts(None, (value,))
    if isinstance(value, list) and value and type(value[0]) is int:
        return PromptParts(value)  # ids are checked when encoded (an id that is not one gets a sentinel value)
    if isinstance(value, list) and value and isinstance(value[0], str):
        return PromptParts(None, (value[0],))  # a batch: vLLM caches each prompt on its own; the first stands for it
    if isinstance(value, list):
        return _message_parts(value)
    return None


def _message_parts(messages: object) -> PromptParts | None:
    if not isinstance(messages, list):
        return None
    texts: list[str] = []
    for index, message in enumerate(messages):
        if index:
            texts.append(_RECORD_SEPARATOR)
        if not isinstance(message, dict):
            texts.append(_UNIT_SEPARATOR)
            continue
        role = message.get("role")
        texts += [role if isinstance(role, str) else "", _UNIT_SEPARATOR, _content_text(message.get("content"))]
    return PromptParts(None, tuple(texts))


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_content_text(part) for part in content)
    if isinstance(content, dict):
        text = content.get("text")
        return text if isinstance(text, str) else ""
    return ""
