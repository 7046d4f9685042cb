"""Fault-injection directives written inside a prompt (or the last user message).

- `[[sim:status=500]]`       answer with that status and a vLLM-shaped error body, before any work;
- `[[sim:drop-after=N]]`     stream N token events, then close the connection without `[DONE]`
                             (non-streaming: send the headers and part of the body, then close);
- `[[sim:error-after=N]]`    stream N token events, then vLLM's mid-stream error event and `[DONE]`;
- `[[sim:hang]]`             never answer, not even headers; the request ends when the client goes away
                             (recorded as aborted);
- `[[sim:delay-ms=N]]`       wait N ms before the request enters the engine (after a stream's headers; not
                             counted as queueing, but part of the TTFT);
- `[[sim:fail-load]]`        if the request needs a CPU-tier load, that load fails (what follows depends on
                             `--load-failure-policy`, see `engine`).

The directive text stays part of the prompt (it is tokenized like any text). Unknown or malformed directives
are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PATTERN = re.compile(r"\[\[sim:([a-z-]+)(?:=([0-9]+))?\]\]")


@dataclass(frozen=True)
class Directives:
    status: int | None = None
    drop_after: int | None = None
    error_after: int | None = None
    hang: bool = False
    delay_ms: int = 0
    fail_load: bool = False


NO_DIRECTIVES = Directives()


def parse_directives(text: str) -> Directives:
    """Collect the directives in `text`; a later one of a kind wins."""
    if "[[sim:" not in text:
        return NO_DIRECTIVES
    values: dict[str, int | None] = {}
    for name, number in _PATTERN.findall(text):
        values[name] = int(number) if number else None
    return Directives(
        status=_status(values.get("status")),
        drop_after=values.get("drop-after"),
        error_after=values.get("error-after"),
        hang="hang" in values,
        delay_ms=values.get("delay-ms") or 0,
        fail_load="fail-load" in values,
    )


def _status(value: int | None) -> int | None:
    return value if value is not None and 400 <= value <= 599 else None
