"""Reuse-aware offload admission: keep one-off prompts out of the CPU tier.

The CPU tier stores every offloadable block it is given, so a stream of never-repeated documents evicts the
reference material that does come back. With `offload.admission: returning` a request is allowed to offload
(`max_offload_tokens` = the tenant's cap) only when its prefix was already seen `min_seen` times within
`window_s`; otherwise it is sent with `max_offload_tokens: 0` and the tier keeps what it holds.

Which prefix. A request is identified by one chained fingerprint: the one covering its first `prefix_chunks`
chunks (64 tokens each, so 4 chunks = 256 tokens; a shorter prompt uses its last whole chunk). Chaining makes
that one value stand for the whole leading span, so nothing deeper than it needs looking up. Four chunks
rather than one or two: the first few chunks of a tenant's prompts are often a shared instruction header,
which would make every request look returning; 256 tokens reaches past a short header into the document while
staying inside even short documents, so the question that follows a document does not change the key. A tenant
whose shared header is longer raises `prefix_chunks` past it; with too small a value admission only degrades
to `all` (everything admitted), it never refuses a returning document. A prompt with no whole chunk is refused
(`short`): there is nothing the tier could keep for it.

The doorkeeper. A count-min sketch per tenant with 8-bit saturating counters in `DEPTH` rows of `width`
counters, indexed directly by 16-bit slices of the fingerprint (a keyed hash, hence uniform: no more hashing).
Time is cut into generations of `window_s / 2`; a count is the sum of the current and the previous
generation, so it covers between half a window and a whole one, and older counts vanish when a generation
rolls over. Memory is fixed (2 x DEPTH x width bytes per tenant), a request costs DEPTH reads and at most DEPTH
writes, and only fingerprints are seen, never text. Overcounting (a new prefix taken for returning) happens
when every row collides; with 65,536 counters per row and 10,000 distinct prefixes per window that is about
1 request in 2,500.

`simulate_admission` replays recorded events through the same doorkeeper, for `kvgate plan`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.reuse.fingerprint import (
    DEFAULT_CHARS_PER_TOKEN,
    PromptParts,
    canonical_parts,
    exact_head_parts,
    fingerprints,
    kept_prompt_bytes,
)

Decision = Literal["returning", "new", "short"]
DECISIONS: tuple[Decision, ...] = ("returning", "new", "short")
DEPTH = 4
ROW_BITS = 16
DEFAULT_WIDTH = 1 << ROW_BITS
COUNTER_MAX = 255
CHUNK_TOKENS = 64  # the OffloadingConnector's usual block: the unit the CPU tier stores
# A prompt kept as JSON text this long has its admission span read from its head (request_span). Reading a head
# exactly costs 12-50 µs (more for chat, whose check scans the rest of the cut message); decoding the whole prompt
# costs about 0.35 µs per KiB of text, more for many messages. On the 2-core box the head was the cheaper from about
# 69 KiB for one long message, 34 KiB for a completion and under 21 KiB for a 100-message conversation.
HEAD_SPAN_FROM = 64 * 1024


@dataclass(frozen=True)
class AdmissionRule:
    """What a tenant's `offload.admission` asks for (the policy model converts into this)."""

    mode: Literal["all", "returning"] = "all"
    window_s: float = 3600.0
    min_seen: int = 1
    prefix_chunks: int = 4


@dataclass(frozen=True)
class AdmissionResult:
    decision: Decision
    seen: int  # times the prefix was seen in the window before this request (0 for `short`)

    @property
    def admitted(self) -> bool:
        return self.decision == "returning"


def admission_key(chain: Sequence[bytes], prefix_chunks: int) -> bytes | None:
    """The fingerprint a request is admitted by: the one covering its first `prefix_chunks` chunks."""
    if not chain:
        return None
    return chain[min(prefix_chunks, len(chain)) - 1]


def prompt_key(trace_key: bytes, prompt: str | list[int], prefix_chunks: int) -> bytes | None:
    """The admission key of a prompt, fingerprinting only the span it needs (cost independent of its length)."""
    head = prompt[: prefix_units(isinstance(prompt, list), prefix_chunks)]
    return admission_key(fingerprints(trace_key, head, CHUNK_TOKENS, DEFAULT_CHARS_PER_TOKEN), prefix_chunks)


def holds_a_chunk(prompt: str | list[int]) -> bool:
    """Whether `prompt_key` finds a whole chunk in the prompt (else its key is None: the request is `short`)."""
    return len(prompt) >= prefix_units(isinstance(prompt, list), 1)


def prefix_units(token_ids: bool, prefix_chunks: int) -> int:
    """How many tokens (token-id prompts) or canonical characters (text and chat) the admission key covers."""
    return prefix_chunks * (CHUNK_TOKENS if token_ids else round(CHUNK_TOKENS * DEFAULT_CHARS_PER_TOKEN))


def prefix_span(parts: PromptParts, prefix_chunks: int) -> str | list[int]:
    """The leading span of a prompt that `prompt_key` reads: the same key as from the whole canonical prompt, without
    joining a long prompt's pieces into one string first."""
    return parts.head(prefix_units(parts.ids is not None, prefix_chunks))


def request_span(
    request: dict[str, Any], prefix_chunks: int, head_from: int = HEAD_SPAN_FROM
) -> str | list[int] | None:
    """`prefix_span` of a request's prompt. A long prompt kept as JSON text is read from its head where the head
    shows the span exactly (a 128k-token prompt is then not decoded before the request is sent); otherwise, and
    for every other prompt, from the whole prompt. A kept prompt shorter than `head_from` bytes is decoded whole."""
    if kept_prompt_bytes(request) >= head_from:
        for size in head_sizes(prefix_chunks):
            found = exact_head_parts(request, size)
            if found is None:
                continue
            parts, exact = found
            units = prefix_units(parts.ids is not None, prefix_chunks)
            if exact >= units:
                return parts.head(units)
    whole = canonical_parts(request)
    return prefix_span(whole, prefix_chunks) if whole is not None else None


def head_sizes(prefix_chunks: int) -> tuple[int, int]:
    """The heads tried, in bytes: one that holds the span of plain text or token ids with room for the keys and
    messages before it, then one for text written as escapes (up to 12 bytes a character)."""
    units = prefix_units(False, prefix_chunks)
    return 2 * units + 1024, 12 * units + 4096


def row_offsets(key: bytes, width: int) -> tuple[int, int, int, int]:
    """The counter of `key` in each of the DEPTH rows, as byte offsets into the DEPTH x width table."""
    value = int.from_bytes(key[:8], "little")
    mask = width - 1
    return (value & mask, width + ((value >> 16) & mask), 2 * width + ((value >> 32) & mask),
            3 * width + ((value >> 48) & mask))


def generation(now: float, window_s: float) -> int:
    """Which half-window `now` falls in (a wall-clock number, so replicas agree on it)."""
    return int(now // (window_s / 2))


def decide(seen: int, rule: AdmissionRule) -> Decision:
    return "returning" if seen >= rule.min_seen else "new"


class Doorkeeper:
    """One tenant's windowed count-min sketch (two generations of DEPTH x width 8-bit counters)."""

    def __init__(self, width: int = DEFAULT_WIDTH) -> None:
        if width & (width - 1) or not 1 <= width <= DEFAULT_WIDTH:
            raise ValueError("width must be a power of two between 1 and 65536")
        self.width = width
        self._generation = -1
        self._window_s = 0.0
        self._current = bytearray(DEPTH * width)
        self._previous = bytearray(DEPTH * width)

    @property
    def memory_bytes(self) -> int:
        return len(self._current) + len(self._previous)

    def observe(self, key: bytes, now: float, window_s: float) -> int:
        """Count one sighting of `key`; returns how often it was seen in the window before."""
        if int(now // (window_s / 2)) != self._generation or window_s != self._window_s:
            self._roll(now, window_s)
        current, previous = self._current, self._previous
        a, b, c, d = row_offsets(key, self.width)
        ta, tb, tc, td = (current[a] + previous[a], current[b] + previous[b], current[c] + previous[c],
                          current[d] + previous[d])
        seen = min(ta, tb, tc, td)
        # Conservative update: only the rows at the minimum rise, which keeps collisions from inflating counts.
        if seen < COUNTER_MAX:
            for offset, total in ((a, ta), (b, tb), (c, tc), (d, td)):
                if total == seen and current[offset] < COUNTER_MAX:
                    current[offset] += 1
        return seen

    def _roll(self, now: float, window_s: float) -> None:
        number = generation(now, window_s)
        if number == self._generation and window_s == self._window_s:
            return
        if number == self._generation + 1 and window_s == self._window_s:
            self._previous, self._current = self._current, self._previous
            self._current[:] = bytes(len(self._current))
        else:
            self._current[:] = bytes(len(self._current))
            self._previous[:] = bytes(len(self._previous))
        self._generation, self._window_s = number, window_s


def admit_key(keeper: Doorkeeper, key: bytes | None, now: float, rule: AdmissionRule) -> AdmissionResult:
    """The decision for one request of a `returning` tenant, counting it."""
    if key is None:
        return AdmissionResult("short", 0)
    seen = keeper.observe(key, now, rule.window_s)
    return AdmissionResult(decide(seen, rule), seen)


@dataclass(frozen=True)
class AdmissionEvent:
    """One recorded generation request, as the reuse trace keeps it (no text)."""

    at: float  # seconds; only differences matter
    tenant: str
    fingerprints: Sequence[bytes]  # the request's chained prefix fingerprints, at least the first prefix_chunks


def simulate_admission(
    events: Iterable[AdmissionEvent], rules: Mapping[str, AdmissionRule] | AdmissionRule,
    width: int = DEFAULT_WIDTH,
) -> list[AdmissionResult | None]:
    """Replay `events` (in time order) through the live doorkeeper: one result per event, None where the
    tenant's rule is `all` (nothing would have changed). Pure: no clock, no I/O, fresh sketches."""
    keepers: dict[str, Doorkeeper] = {}
    out: list[AdmissionResult | None] = []
    for event in events:
        rule = rules if isinstance(rules, AdmissionRule) else rules.get(event.tenant, AdmissionRule())
        if rule.mode != "returning":
            out.append(None)
            continue
        keeper = keepers.setdefault(event.tenant, Doorkeeper(width))
        out.append(admit_key(keeper, admission_key(event.fingerprints, rule.prefix_chunks), event.at, rule))
    return out
