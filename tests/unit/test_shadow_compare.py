"""Shadow pair helpers: generated text of an arm (streams and bodies) and the per-tenant summary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.shadow.compare import PairRecord, generated_text
from gateway.shadow.stats import MIN_PAIRS, tenant_summary

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "http"


def _reference_text(body: bytes) -> str:
    texts = []
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line[6:]).get("choices", []):
                texts.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(texts)


@pytest.mark.parametrize("name", ["offload_stream_chat.sse.txt", "control_stream_completion.sse.txt"])
def test_stream_text_matches_a_full_parse_of_captured_streams(name: str) -> None:
    body = (FIXTURES / name).read_bytes().split(b"\n\n", 1)[1]
    assert generated_text(body) == _reference_text(body) != ""


def test_escapes_are_decoded() -> None:
    stream = b'data: {"choices":[{"delta":{"content":"a\\"b\\\\n\\u00e9"}}]}\n\ndata: [DONE]\n\n'
    assert generated_text(stream) == 'a"b\\n\u00e9'


def test_non_stream_bodies() -> None:
    assert generated_text(b'{"choices":[{"message":{"role":"assistant","content":"hi"}}]}') == "hi"
    assert generated_text(b'{"choices":[{"text":"yo"}]}') == "yo"
    assert generated_text(b"not json") is None


def _pair(delta: float | None, mismatch: bool = False) -> PairRecord:
    return PairRecord("t", "r", "offload", "control", delta, 0.0, 0, True, mismatch, 0.0)


def test_summary_needs_enough_pairs_to_conclude() -> None:
    few = tenant_summary([_pair(-0.1)] * (MIN_PAIRS - 1), {})
    assert not few["conclusive"]
    assert few["verdict"].startswith("too few pairs")


@pytest.mark.parametrize(("pairs", "too_few"), [(19, True), (20, False)])
def test_the_documented_threshold_is_20_pairs(pairs: int, too_few: bool) -> None:
    """README: "too few pairs to conclude" below 20 pairs (a literal, not the module's constant)."""
    summary = tenant_summary([_pair(-0.1 - index / 1000) for index in range(pairs)], {})
    assert summary["verdict"].startswith("too few pairs") is too_few
    assert summary["conclusive"] is not too_few


def test_summary_finds_a_clear_effect_and_reports_mismatches() -> None:
    pairs = [_pair(-0.1 - index / 1000) for index in range(30)] + [_pair(-0.05, mismatch=True)]
    summary = tenant_summary(pairs, {"dropped": 2, "error": 1})
    assert summary["conclusive"]
    assert summary["ttft_delta_ci95_s"][1] < 0
    assert summary["mismatches"] == 1
    assert (summary["dropped"], summary["errors"]) == (2, 1)
    assert summary["verdict"].startswith("primary is faster") and "mismatch" in summary["verdict"]


def test_summary_says_when_the_interval_spans_zero() -> None:
    pairs = [_pair((-1) ** index * 0.01 * (index % 7)) for index in range(40)]
    assert tenant_summary(pairs, {})["verdict"].startswith("no clear difference")
