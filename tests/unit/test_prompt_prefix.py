"""The affinity prefix is the first characters of the whole prompt text, without copying a long prompt whole."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.proxy.rewrite import AFFINITY_CHARS, prompt_prefix

LONG = "x" * 10 * AFFINITY_CHARS

CASES: list[dict[str, Any]] = [
    {"prompt": LONG},
    {"prompt": "short"},
    {"prompt": [1, 2, 3]},
    {"messages": [{"role": "system", "content": "a" * 100}, {"role": "user", "content": "b" * 1000}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "t"}, {"content": "c" * 300}]}]},
    {"messages": [{"role": "user", "content": "q"}] * 20},
    {"input": [{"content": "i" * 200}, {"content": "j" * 200}, "k" * 50]},
    {"model": "no prompt"},
]


def whole_text(value: object) -> str:
    """The prompt's text as the prefix was defined before it was bounded: all of it, then cut."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(whole_text(item) for item in value[:8])
    if isinstance(value, dict):
        return whole_text(value.get("content", ""))
    return str(value)


@pytest.mark.parametrize("request_body", CASES)
def test_prefix_is_the_start_of_the_whole_prompt_text(request_body: dict[str, Any]) -> None:
    field = next((name for name in ("prompt", "messages", "input") if name in request_body), None)
    expected = whole_text(request_body[field])[:AFFINITY_CHARS] if field else ""
    assert prompt_prefix(request_body) == expected
