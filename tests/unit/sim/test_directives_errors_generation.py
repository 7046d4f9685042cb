"""Fault directives, vLLM-shaped error bodies and the generated text (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.directives import NO_DIRECTIVES, Directives, parse_directives
from gateway.sim.errors import (
    SimError,
    bad_request,
    error_body,
    error_type,
    route_error,
    salt_error,
    unknown_model,
    validation_error,
)
from gateway.sim.generation import OutputGenerator
from gateway.sim.tokenizer import decode, encode

# --- directives -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "directives"),
    [
        ("", NO_DIRECTIVES),
        ("no directive here [[sim", NO_DIRECTIVES),
        ("[[sim:status=500]]", Directives(status=500)),
        ("x [[sim:status=503]] y", Directives(status=503)),
        ("[[sim:status=400]]", Directives(status=400)),
        ("[[sim:status=599]]", Directives(status=599)),
        ("[[sim:status=200]]", NO_DIRECTIVES),  # not an error status: ignored
        ("[[sim:status=399]]", NO_DIRECTIVES),
        ("[[sim:status=600]]", NO_DIRECTIVES),
        ("[[sim:status]]", NO_DIRECTIVES),  # a status without a value
        ("[[sim:drop-after=0]]", Directives(drop_after=0)),
        ("[[sim:drop-after=3]]", Directives(drop_after=3)),
        ("[[sim:error-after=2]]", Directives(error_after=2)),
        ("[[sim:hang]]", Directives(hang=True)),
        ("[[sim:hang=1]]", Directives(hang=True)),  # a value on a flag changes nothing
        ("[[sim:delay-ms=250]]", Directives(delay_ms=250)),
        ("[[sim:delay-ms]]", NO_DIRECTIVES),
        ("[[sim:fail-load]]", Directives(fail_load=True)),
        ("[[sim:status=500]][[sim:status=502]]", Directives(status=502)),  # the later one wins
        ("[[sim:hang]] [[sim:fail-load]] [[sim:delay-ms=5]]", Directives(hang=True, delay_ms=5, fail_load=True)),
        ("[[sim:status=-5]]", NO_DIRECTIVES),  # malformed: ignored
        ("[[sim:STATUS=500]]", NO_DIRECTIVES),  # names are lower-case
        ("[[sim: status=500]]", NO_DIRECTIVES),
        ("[[sim:status=5e2]]", NO_DIRECTIVES),
        ("[[sim:unknown=5]]", NO_DIRECTIVES),
        ("[sim:hang]", NO_DIRECTIVES),
        ("[[sim:drop-after=99999999999999999999]]", Directives(drop_after=99999999999999999999)),
    ],
)
def test_parse_directives(text: str, directives: Directives) -> None:
    assert parse_directives(text) == directives


def test_text_without_the_marker_shares_the_empty_directives() -> None:
    assert parse_directives("plain") is NO_DIRECTIVES


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_never_breaks_the_parser(text: str) -> None:
    found = parse_directives(text)
    if "[[sim:" not in text:
        assert found is NO_DIRECTIVES
    assert found.status is None or 400 <= found.status <= 599


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "BadRequestError"),
        (404, "NotFoundError"),
        (422, "UnprocessableEntityError"),
        (500, "InternalServerError"),
        (501, "NotImplementedError"),
        (503, "ServiceUnavailableError"),
        (429, "Too Many Requests"),  # no vLLM class: the HTTP phrase
        (502, "Bad Gateway"),
        (418, "I'm a Teapot"),
        (599, "Error"),  # not an HTTP status Python knows
    ],
)
def test_error_type(status: int, kind: str) -> None:
    assert error_type(status) == kind


def test_error_body_shape_and_overrides() -> None:
    assert error_body(500, "boom") == {"error": {"message": "boom", "type": "InternalServerError", "param": None,
                                                 "code": 500}}
    assert error_body(400, "m", "Custom", "p")["error"] == {"message": "m", "type": "Custom", "param": "p",
                                                            "code": 400}
    error = SimError(503, "down")
    assert (error.status, str(error), error.body["error"]["type"]) == (503, "down", "ServiceUnavailableError")


def test_validation_error_message_mirrors_pydantic() -> None:
    error = validation_error(("body", "messages", 0), "missing", "Field required")
    assert error.body["error"] == {
        "message": "1 validation error:\n  {'type': 'missing', 'loc': ('body', 'messages', 0), "
                   "'msg': 'Field required'}",
        "type": "Bad Request", "param": "body.messages.0", "code": 400}
    assert validation_error(("body",), "x", "y", param="other").body["error"]["param"] == "other"


def test_the_named_errors() -> None:
    assert salt_error("bad").body["error"]["param"] == "cache_salt"
    assert "Value error, bad (parameter=cache_salt)" in salt_error("bad").body["error"]["message"]
    assert unknown_model("x").body == {"error": {"message": "The model `x` does not exist.", "type": "NotFoundError",
                                                 "param": "model", "code": 404}}
    assert bad_request("m", "p").body["error"] == {"message": "m", "type": "BadRequestError", "param": "p",
                                                   "code": 400}
    assert route_error(404).body["error"] == {"message": "Not Found", "type": "Not Found", "param": None,
                                              "code": 404}
    assert route_error(405).body["error"]["message"] == "Method Not Allowed"


# --- generation -----------------------------------------------------------------------------------------------

PROMPT = encode("the same prompt")


def generated(generator: OutputGenerator, count: int, temperature: float | None = 0,
              seed: int | None = None, prompt: list[int] = PROMPT) -> str:
    return decode(generator.tokens(prompt, count, temperature, seed))


@pytest.mark.parametrize("count", [1, 2, 7, 16, 100])
def test_exactly_count_tokens_of_lower_case_words(count: int) -> None:
    tokens = OutputGenerator(0, False).tokens(PROMPT, count, 0, None)
    text = decode(tokens)
    assert len(tokens) == len(text) == count
    assert set(text) <= set("abcdefghijklmnopqrstuvwxyz ")
    assert text.startswith(" ")  # words are separated by (and begin with) a space
    assert encode(text) == tokens  # re-tokenizes to the same ids: a follow-up turn can reuse its blocks


def test_greedy_output_is_a_function_of_the_prompt_alone() -> None:
    one, other = OutputGenerator(1, False), OutputGenerator(2, False)
    assert generated(one, 30) == generated(other, 30)  # the server seed does not matter
    assert generated(one, 30) != generated(one, 30, prompt=encode("another prompt"))
    assert generated(one, 10) == generated(one, 30)[:10]  # a shorter answer is a prefix of a longer one


def test_a_request_seed_makes_sampling_reproducible_and_distinct_from_greedy() -> None:
    generator = OutputGenerator(0, False)
    assert generated(generator, 30, 0.8, 7) == generated(OutputGenerator(9, False), 30, 0.8, 7)
    assert generated(generator, 30, 0.8, 7) != generated(generator, 30, 0.8, 8)
    assert generated(generator, 30, 0.8, 7) != generated(generator, 30, 0, None)
    assert generated(generator, 30, 0, 7) == generated(generator, 30, 0, None)  # greedy ignores the seed


def test_sampling_without_a_seed_follows_the_server_seed() -> None:
    first, second = OutputGenerator(5, False), OutputGenerator(5, False)
    runs = [generated(first, 30, 1.0) for _ in range(3)]
    assert runs == [generated(second, 30, None) for _ in range(3)]  # same server seed, same sequence
    assert len(set(runs)) == 3


def test_corrupt_output_changes_only_deterministic_requests() -> None:
    right, wrong = OutputGenerator(5, False), OutputGenerator(5, True)
    assert generated(right, 30) != generated(wrong, 30)
    assert generated(right, 30, 0.5, 1) != generated(wrong, 30, 0.5, 1)
    assert generated(wrong, 30) == generated(OutputGenerator(6, True), 30)  # still deterministic
    assert generated(right, 30, 1.0) == generated(wrong, 30, 1.0)  # random draws are untouched
