"""Request validation (pure): vLLM's order of checks, each refusal's status, type and param, the transfer caps'
accept-or-ignore rule, prompts of every shape, and what a valid body resolves to. Error bodies of vLLM 0.25.0
captures are the oracle where one exists."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sim.directives import NO_DIRECTIVES, Directives
from gateway.sim.errors import SimError
from gateway.sim.protocol import (
    GenRequest,
    Kind,
    ParseContext,
    TransferCaps,
    check_cache_salt,
    completion_prompt,
    decode_json,
    message_text,
    parse_generation,
    requested_max_tokens,
    responses_messages,
    transfer_caps,
)
from gateway.sim.tokenizer import apply_chat_template, encode
from tests.unit.sim.captures import captured_bodies

CONTEXT = ParseContext("m", 16384, 16, "abc", offload=True)


def parse(body: dict[str, Any], kind: Kind = Kind.COMPLETION, context: ParseContext = CONTEXT) -> GenRequest:
    return parse_generation(kind, body, context)


def refusal(body: dict[str, Any], kind: Kind = Kind.COMPLETION) -> SimError:
    with pytest.raises(SimError) as caught:
        parse(body, kind)
    return caught.value


def error_of(error: SimError) -> tuple[int, str, str | None]:
    inner = error.body["error"]
    assert inner["code"] == error.status
    assert list(inner) == ["message", "type", "param", "code"]
    return error.status, inner["type"], inner["param"]


# --- JSON -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "position"),
    [
        (b"{bad", 1),  # the captured case: 'Expecting property name' at offset 1
        (b"", 0),
        (b"{", 1),
        (b'{"a": 1,}', 8),
        (b'{"a": tru}', 6),
        (b"\xff", 0),  # not UTF-8
        (b'{"a": "\xff"}', 7),
    ],
)
def test_malformed_json_is_refused_with_its_error_position(raw: bytes, position: int) -> None:
    with pytest.raises(SimError) as caught:
        decode_json(raw)
    assert error_of(caught.value) == (400, "Bad Request", f"body.{position}")
    assert "json_invalid" in caught.value.body["error"]["message"]


def test_the_captured_bad_json_error() -> None:
    with pytest.raises(SimError) as caught:
        decode_json(b"{bad")
    expected = captured_bodies()["err_bad_json"]["body"]["error"]
    assert (caught.value.status, caught.value.body["error"]["type"], caught.value.body["error"]["param"]) == (
        400, expected["type"], expected["param"])


@pytest.mark.parametrize("raw", [b"[]", b"1", b'"text"', b"null", b"true"])
def test_a_body_that_is_not_an_object_is_refused(raw: bytes) -> None:
    with pytest.raises(SimError) as caught:
        decode_json(raw)
    assert error_of(caught.value) == (400, "Bad Request", "body")


def test_any_json_object_decodes() -> None:
    assert decode_json(b' {"prompt": "x", "n": 1.5e3, "deep": {"a": [null]}} ') == {
        "prompt": "x", "n": 1500.0, "deep": {"a": [None]}}


# --- cache_salt ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("salt", [None, "a", "s" * 128, "tenant:epoch:user", "é" * 128, "a b\tc", "%"])
def test_valid_salts(salt: str | None) -> None:
    assert check_cache_salt({"cache_salt": salt}) == salt


@pytest.mark.parametrize(
    ("salt", "fragment"),
    [
        ("", "non-empty string"),
        (5, "non-empty string"),
        (True, "non-empty string"),
        (["a"], "non-empty string"),
        ({"a": 1}, "non-empty string"),
        ("s" * 129, "at most 128 characters"),
        ("a@b", "at most 128 characters"),
        ("a/b", "at most 128 characters"),
        ("a\\b", "at most 128 characters"),
        ("a\x00b", "at most 128 characters"),
    ],
)
def test_invalid_salts_are_refused_as_vllm_does(salt: object, fragment: str) -> None:
    with pytest.raises(SimError) as caught:
        check_cache_salt({"cache_salt": salt})
    assert error_of(caught.value) == (400, "Bad Request", "cache_salt")
    assert fragment in caught.value.body["error"]["message"]
    assert "(parameter=cache_salt)" in caught.value.body["error"]["message"]


@pytest.mark.parametrize("case", ["err_cache_salt_empty", "err_cache_salt_int"])
def test_the_captured_salt_errors(case: str) -> None:
    expected = captured_bodies()[case]["body"]["error"]
    salt = "" if case.endswith("empty") else 5
    error = refusal({"model": "m", "prompt": "x", "max_tokens": 4, "cache_salt": salt})
    assert (error.status, error.body["error"]["type"], error.body["error"]["param"]) == (
        400, expected["type"], expected["param"])
    assert expected["message"].startswith(error.body["error"]["message"].split("\n")[0])


# --- the order of the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # A bad salt is reported before a bad type, a bad type before stream_options, those before the model...
        ({"cache_salt": "", "stream": "yes", "model": "nope"}, "cache_salt"),
        ({"stream": "yes", "stream_options": {}, "model": "nope"}, "body.stream"),
        ({"stream_options": {"include_usage": True}, "model": "nope", "prompt": "x"}, "body"),
        ({"model": "nope", "n": 2, "prompt": "x"}, "model"),
        ({"n": 2, "prompt": [99999]}, "n"),
        # ...and the engine-side checks come last.
        ({"prompt": [99999], "max_tokens": 0}, "max_tokens"),
        ({"prompt": [99999]}, None),
    ],
)
def test_checks_run_in_vllms_order(body: dict[str, Any], param: str | None) -> None:
    assert refusal(body).body["error"]["param"] == param


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [
        ("kv_transfer_params", "abc", "dict_type"),
        ("kv_transfer_params", [], "dict_type"),
        ("stream", 1, "bool_type"),
        ("stream", "true", "bool_type"),
        ("stream_options", "x", "dict_type"),
        ("model", 5, "string_type"),
        ("temperature", "hot", "float_type"),
        ("temperature", True, "float_type"),  # a boolean is not a number
        ("seed", 1.5, "int_type"),
        ("seed", False, "int_type"),
        ("n", "1", "int_type"),
        ("max_tokens", 4.0, "int_type"),
        ("max_completion_tokens", True, "int_type"),
        ("max_output_tokens", "8", "int_type"),
    ],
)
def test_field_types(field: str, value: object, kind: str) -> None:
    error = refusal({"prompt": "x", field: value})
    assert error_of(error) == (400, "Bad Request", f"body.{field}")
    assert f"'type': '{kind}'" in error.body["error"]["message"]


def test_the_captured_kv_transfer_params_type_error() -> None:
    expected = captured_bodies()["err_kvtp_not_object"]["body"]["error"]
    error = refusal({"model": "m", "prompt": "x", "kv_transfer_params": "abc"})
    assert error.body["error"]["param"] == expected["param"]
    assert error.body["error"]["message"].startswith("1 validation error:\n  {'type': 'dict_type', 'loc': ('body', "
                                                     "'kv_transfer_params'), 'msg': 'Input should be a valid "
                                                     "dictionary'")


@pytest.mark.parametrize("field", ["kv_transfer_params", "stream", "stream_options", "model", "temperature", "seed",
                                   "n", "max_tokens", "cache_salt"])
def test_null_is_accepted_for_every_checked_field(field: str) -> None:
    assert parse({"prompt": "x", field: None}).prompt == encode("x")


def test_unknown_fields_are_ignored_and_kept_in_the_body() -> None:
    request = parse({"prompt": "x", "frobnicate": {"deep": [1]}, "user": "u"})
    assert request.body["frobnicate"] == {"deep": [1]}


def test_the_captured_unknown_model_error() -> None:
    error = refusal({"model": "nope", "prompt": "x", "max_tokens": 4})
    assert error.body == captured_bodies()["err_unknown_model"]["body"]
    assert error.status == 404


@pytest.mark.parametrize("n", [0, 2, -1])
def test_n_other_than_one_is_refused(n: int) -> None:
    assert error_of(refusal({"prompt": "x", "n": n})) == (400, "BadRequestError", "n")


def test_stream_options_need_stream_true() -> None:
    for stream in (None, False):
        error = refusal({"prompt": "x", "stream": stream, "stream_options": {"include_usage": True}})
        assert "Stream options can only be defined when `stream=True`." in error.body["error"]["message"]
    assert parse({"prompt": "x", "stream": True, "stream_options": {"include_usage": True}}).include_usage


# --- engine-side limits -------------------------------------------------------------------------------------


def test_the_captured_context_overflow_error() -> None:
    error = refusal({"prompt": [5] * 16380, "max_tokens": 100})
    assert error.body == captured_bodies()["err_context_overflow"]["body"]


@pytest.mark.parametrize(("prompt_len", "max_tokens", "fits"), [(16368, 16, True), (16369, 16, False),
                                                                (1, 16383, True), (1, 16384, False)])
def test_the_context_limit_is_inclusive(prompt_len: int, max_tokens: int, fits: bool) -> None:
    body = {"prompt": [5] * prompt_len, "max_tokens": max_tokens}
    if fits:
        assert len(parse(body).prompt) == prompt_len
    else:
        assert refusal(body).body["error"]["param"] == "input_tokens"


def test_the_captured_out_of_vocabulary_error() -> None:
    assert refusal({"prompt": [1, 40000], "max_tokens": 4}).body == captured_bodies()["err_token_oov"]["body"]


@pytest.mark.parametrize(("prompt", "oov"), [([-1], -1), ([31999, 32000], 32000), ([2**40], 2**40)])
def test_out_of_vocabulary_ids(prompt: list[int], oov: int) -> None:
    assert refusal({"prompt": prompt}).body["error"]["message"] == f"Token id {oov} is out of vocabulary"


@pytest.mark.parametrize("prompt", ["", [], [""]])
def test_an_empty_prompt_is_refused(prompt: object) -> None:
    error = refusal({"prompt": prompt})
    assert error.status == 400
    assert error.body["error"]["param"] in {"prompt", "body.prompt"}


# --- prompts -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "tokens", "text"),
    [
        ("hi", [107, 108], "hi"),
        (["hi"], [107, 108], "hi"),  # a one-element batch is one prompt
        ([5, 6], [5, 6], ""),  # token ids carry no directive text
        ([[5, 6]], [5, 6], ""),
        ("é", [198, 172], "é"),
    ],
)
def test_completion_prompts(prompt: object, tokens: list[int], text: str) -> None:
    assert completion_prompt({"prompt": prompt}) == (tokens, text)


@pytest.mark.parametrize(
    ("prompt", "status", "param"),
    [
        (None, 400, "body.prompt"),  # missing
        (5, 400, "body.prompt"),
        ({"a": 1}, 400, "body.prompt"),
        (["a", "b"], 400, "prompt"),  # several prompts: not simulated
        ([[1], [2]], 400, "prompt"),
        ([1, "a"], 400, "prompt"),
        ([True, 2], 400, "prompt"),  # booleans are not token ids
        ([1.5], 400, "prompt"),
    ],
)
def test_completion_prompts_that_are_refused(prompt: object, status: int, param: str) -> None:
    with pytest.raises(SimError) as caught:
        completion_prompt({} if prompt is None else {"prompt": prompt})
    assert (caught.value.status, caught.value.body["error"]["param"]) == (status, param)


@pytest.mark.parametrize(
    ("content", "text"),
    [
        (None, ""),
        ("plain", "plain"),
        ([], ""),
        ([{"type": "text", "text": "a"}, {"type": "input_text", "text": "b"}], "ab"),
        ([{"type": "output_text", "text": "c"}], "c"),
    ],
)
def test_message_text(content: object, text: str) -> None:
    assert message_text(content) == text


@pytest.mark.parametrize(
    "content",
    [5, {"type": "text", "text": "a"}, [{"type": "image_url", "image_url": {"url": "x"}}], [{"type": "text"}],
     [{"type": "text", "text": 5}], ["a"]],
)
def test_non_text_content_is_refused(content: object) -> None:
    with pytest.raises(SimError) as caught:
        message_text(content)
    assert (caught.value.status, caught.value.body["error"]["param"]) == (400, "messages")


@pytest.mark.parametrize("messages", [None, [], "hi", [{"content": "x"}], [{"role": 5, "content": "x"}], ["x"]])
def test_malformed_message_lists_are_refused(messages: object) -> None:
    error = refusal({"messages": messages}, Kind.CHAT)
    assert error_of(error) == (400, "Bad Request", "body.messages")


def test_a_chat_prompt_is_its_template_and_directives_come_from_the_last_user_message() -> None:
    messages = [{"role": "system", "content": "[[sim:status=503]]"}, {"role": "user", "content": "[[sim:hang]]"},
                {"role": "assistant", "content": "ok"}]
    request = parse({"messages": messages}, Kind.CHAT)
    assert request.prompt == apply_chat_template([("system", "[[sim:status=503]]"), ("user", "[[sim:hang]]"),
                                                  ("assistant", "ok")])
    assert request.directives == Directives(hang=True)


def test_a_chat_without_a_user_message_has_no_directives() -> None:
    request = parse({"messages": [{"role": "system", "content": "[[sim:hang]]"}]}, Kind.CHAT)
    assert request.directives is NO_DIRECTIVES


@pytest.mark.parametrize(
    ("body", "pairs"),
    [
        ({"input": "hi"}, [("user", "hi")]),
        ({"input": "hi", "instructions": "be brief"}, [("system", "be brief"), ("user", "hi")]),
        ({"input": "hi", "instructions": ""}, [("user", "hi")]),
        ({"input": "hi", "instructions": 5}, [("user", "hi")]),
        ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "x"}]}]}, [("user", "x")]),
    ],
)
def test_responses_input(body: dict[str, Any], pairs: list[tuple[str, str]]) -> None:
    assert responses_messages(body) == pairs


def test_responses_input_errors_name_the_input_field() -> None:
    assert refusal({"input": 5}, Kind.RESPONSES).body["error"]["param"] == "body.input"


# --- max tokens and caps --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "value"),
    [
        (Kind.COMPLETION, {}, None),
        (Kind.COMPLETION, {"max_tokens": 5}, 5),
        (Kind.CHAT, {"max_tokens": 5, "max_completion_tokens": 7}, 7),  # the newer name wins
        (Kind.CHAT, {"max_tokens": 5, "max_completion_tokens": None}, 5),
        (Kind.RESPONSES, {"max_output_tokens": 3, "max_tokens": 9}, 3),
        (Kind.RESPONSES, {"max_tokens": 9}, None),  # not a Responses API field
    ],
)
def test_requested_max_tokens(kind: Kind, body: dict[str, Any], value: int | None) -> None:
    assert requested_max_tokens(kind, body) == value


@pytest.mark.parametrize("value", [0, -1])
def test_max_tokens_below_one_is_refused(value: int) -> None:
    assert error_of(refusal({"prompt": "x", "max_tokens": value})) == (400, "BadRequestError", "max_tokens")


def test_the_default_max_tokens_applies_when_none_is_asked() -> None:
    assert parse({"prompt": "x"}).max_tokens == 16
    assert parse({"prompt": "x", "max_tokens": 3}).max_tokens == 3


@pytest.mark.parametrize(
    ("params", "caps"),
    [
        (None, TransferCaps()),
        ({}, TransferCaps()),
        ({"max_load_tokens": 0}, TransferCaps(0, None)),
        ({"max_offload_tokens": 4096, "max_load_tokens": 2048}, TransferCaps(2048, 4096)),
        ({"max_offload_tokens": -1}, TransferCaps()),  # vLLM logs a warning and ignores it
        ({"max_load_tokens": True}, TransferCaps()),  # a bool is not an int for vLLM's `type(raw) is int`
        ({"max_load_tokens": 1.0}, TransferCaps()),
        ({"max_load_tokens": "5"}, TransferCaps()),
        ({"max_load_tokens": 2**70}, TransferCaps(2**70, None)),
        ({"other": 1}, TransferCaps()),
    ],
)
def test_transfer_caps(params: dict[str, Any] | None, caps: TransferCaps) -> None:
    assert transfer_caps({"kv_transfer_params": params}, offload=True) == caps


def test_transfer_caps_are_not_read_without_a_connector() -> None:
    assert transfer_caps({"kv_transfer_params": {"max_load_tokens": 0}}, offload=False) == TransferCaps()


# --- what a valid body resolves to -----------------------------------------------------------------------------


def test_a_full_completion_body() -> None:
    request = parse({"model": "m", "prompt": "[[sim:delay-ms=5]] hi", "max_tokens": 3, "stream": True,
                     "stream_options": {"include_usage": True}, "temperature": 0, "seed": 7, "cache_salt": "s",
                     "kv_transfer_params": {"max_offload_tokens": 64}})
    assert (request.kind, request.response_id, request.model) == (Kind.COMPLETION, "cmpl-abc", "m")
    assert (request.max_tokens, request.stream, request.include_usage) == (3, True, True)
    assert (request.temperature, request.seed, request.cache_salt) == (0.0, 7, "s")
    assert request.caps == TransferCaps(None, 64)
    assert request.directives == Directives(delay_ms=5)
    assert request.deterministic


@pytest.mark.parametrize(("kind", "prefix"), [(Kind.COMPLETION, "cmpl-"), (Kind.CHAT, "chatcmpl-"),
                                               (Kind.RESPONSES, "resp_")])
def test_response_ids_use_vllms_prefixes(kind: Kind, prefix: str) -> None:
    body = {"prompt": "x", "messages": [{"role": "user", "content": "x"}], "input": "x"}
    assert parse(body, kind).response_id == prefix + "abc"


@pytest.mark.parametrize(
    ("temperature", "seed", "deterministic"),
    [(0, None, True), (0.0, None, True), (None, None, False), (0.7, None, False), (0.7, 3, True), (None, 0, True)],
)
def test_deterministic_means_greedy_or_seeded(temperature: float | None, seed: int | None,
                                              deterministic: bool) -> None:
    assert parse({"prompt": "x", "temperature": temperature, "seed": seed}).deterministic is deterministic


def test_a_missing_model_means_the_served_one() -> None:
    assert parse({"prompt": "x"}).model == "m"


@settings(max_examples=80, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_text_prompt_round_trips_into_tokens(text: str) -> None:
    request = parse({"prompt": text})
    assert request.prompt == encode(text)
    assert request.include_usage is False and request.stream is False
