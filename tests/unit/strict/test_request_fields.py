"""Strict JSON types of the fields the gateway reads, and the engine-field policy (steering, transfer doors, stored
responses), called directly on parsed bodies. Every accepted and refused JSON type per field, the exact 400 message
and `param`, what is dropped, and which routes the policy applies to."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.policy.model import EngineFieldsPolicy
from gateway.routes import ROUTES, RouteSpec
from gateway.strict.request_fields import (
    COUNTED_FIELDS,
    FieldRefused,
    apply_engine_policy,
    check_types,
)

CHAT = ROUTES["/v1/chat/completions"]
COMPLETIONS = ROUTES["/v1/completions"]
RESPONSES = ROUTES["/v1/responses"]
EMBEDDINGS = ROUTES["/v1/embeddings"]
TOKENIZE = ROUTES["/tokenize"]
MODELS = ROUTES["/v1/models"]
DROP = EngineFieldsPolicy()
REJECT = EngineFieldsPolicy(steering="reject")
STORED = EngineFieldsPolicy(responses_store=True)

# One value of every JSON type, named as the error message names it.
JSON_VALUES: dict[str, list[Any]] = {
    "a boolean": [True, False],
    "a number": [0, 1, -1, 1.5, 2**70, 1e308],
    "a string": ["", "true", "0", "ünïcode ✓"],
    "an array": [[], [True], [1, 2]],
    "an object": [{}, {"include_usage": True}],
}


def values_except(*kinds: str) -> list[tuple[str, Any]]:
    return [(kind, value) for kind, values in JSON_VALUES.items() if kind not in kinds for value in values]


def values_of(*kinds: str) -> list[Any]:
    return [value for kind in kinds for value in JSON_VALUES[kind]]


def refusal(request: dict[str, Any], route: RouteSpec = CHAT) -> BadRequest:
    with pytest.raises(BadRequest) as raised:
        check_types(request, route)
    return raised.value


FIELD_KINDS = [("stream", "a boolean"), ("stream_options", "an object"), ("temperature", "a number"),
               ("user", "a string"), ("kv_transfer_params", "an object")]


@pytest.mark.parametrize(("field", "kind"), FIELD_KINDS)
def test_each_typed_field_accepts_its_one_json_type_and_null(field: str, kind: str) -> None:
    for value in [None, *values_of(kind)]:
        check_types({field: value}, CHAT)  # no error


@pytest.mark.parametrize(("field", "kind", "got", "value"), [
    (field, kind, got, value) for field, kind in FIELD_KINDS for got, value in values_except(kind)
])
def test_each_typed_field_refuses_every_other_json_type_naming_both(field: str, kind: str, got: str,
                                                                    value: Any) -> None:
    error = refusal({field: value})
    assert (error.message, error.param, error.status_code) == (f"{field} must be {kind} (got {got}).", field, 400)


@pytest.mark.parametrize("value", [0, -3, 2**64, 10**30])
def test_an_integer_seed_of_any_size_is_accepted(value: int) -> None:
    check_types({"seed": value}, CHAT)


@pytest.mark.parametrize(("value", "got"), [
    (1.0, "a number"),  # an integral float is still not an integer
    (1.5, "a number"),
    (True, "a boolean"),  # Python's bool is an int; JSON's is not
    ("42", "a string"),
    ([42], "an array"),
    ({"seed": 42}, "an object"),
])
def test_a_seed_must_be_a_json_integer(value: Any, got: str) -> None:
    assert refusal({"seed": value}).message == f"seed must be an integer (got {got})."


@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_never_a_temperature(value: bool) -> None:
    assert refusal({"temperature": value}).message == "temperature must be a number (got a boolean)."


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_numbers_to_the_type_check(value: float) -> None:
    check_types({"temperature": value}, CHAT)  # range is the engine's business; the type is a number


@pytest.mark.parametrize(("option", "value", "got"), [
    ("include_usage", "true", "a string"),
    ("include_usage", 1, "a number"),
    ("continuous_usage_stats", [], "an array"),
    ("continuous_usage_stats", {}, "an object"),
])
def test_stream_options_members_are_booleans_and_named_with_their_prefix(option: str, value: Any,
                                                                         got: str) -> None:
    error = refusal({"stream": True, "stream_options": {option: value}})
    assert error.message == f"stream_options.{option} must be a boolean (got {got})."
    assert error.param == f"stream_options.{option}"


@pytest.mark.parametrize("options", [{}, {"include_usage": True}, {"include_usage": None},
                                     {"continuous_usage_stats": False}, {"unrelated": "x"}])
def test_well_typed_stream_options_pass(options: dict[str, Any]) -> None:
    check_types({"stream": True, "stream_options": options}, CHAT)


def test_stream_options_that_is_not_an_object_is_reported_as_itself_not_its_members() -> None:
    assert refusal({"stream_options": [{"include_usage": "x"}]}).param == "stream_options"


def test_the_first_bad_field_in_table_order_is_named() -> None:
    error = refusal({"user": 5, "stream": "yes", "temperature": "hot"})
    assert error.param == "stream"


def test_fields_the_gateway_does_not_read_are_not_typed() -> None:
    check_types({"model": 5, "max_tokens": "many", "messages": "hi", "n": True}, CHAT)


@pytest.mark.parametrize(("field", "value", "got"), [
    ("store", "false", "a string"),
    ("store", 0, "a number"),
    ("background", "yes", "a string"),
    ("previous_response_id", 123, "a number"),
    ("previous_response_id", ["resp_1"], "an array"),
])
def test_responses_fields_are_typed_on_the_responses_route_only(field: str, value: Any, got: str) -> None:
    kind = "a string" if field == "previous_response_id" else "a boolean"
    assert refusal({field: value}, RESPONSES).message == f"{field} must be {kind} (got {got})."
    check_types({field: value}, CHAT)  # chat has no such fields: not the gateway's to type


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS, RESPONSES, EMBEDDINGS])
def test_an_empty_body_passes_every_route(route: RouteSpec) -> None:
    check_types({}, route)


# --- engine fields ----------------------------------------------------------------------------------------------


STEERING = ["priority", "session_id", "request_id", "data_parallel_rank", "vllm_xargs"]


@pytest.mark.parametrize("route", [CHAT, COMPLETIONS, EMBEDDINGS])
def test_drop_removes_every_steering_field_and_names_them_in_order(route: RouteSpec) -> None:
    request: dict[str, Any] = {"model": "m", "vllm_xargs": {"a": 1}, "priority": -10, "request_id": "r",
                               "session_id": "s", "data_parallel_rank": 3}
    dropped = apply_engine_policy(request, route, DROP)
    assert dropped == STEERING  # table order, not body order
    assert request == {"model": "m"}


@pytest.mark.parametrize("value", [None, 0, "", [], {}, False])
def test_a_steering_field_counts_as_present_whatever_its_value(value: Any) -> None:
    request = {"priority": value}
    assert apply_engine_policy(request, CHAT, DROP) == ["priority"]
    assert request == {}


@pytest.mark.parametrize("field", STEERING)
def test_reject_answers_400_naming_the_field(field: str) -> None:
    request = {field: 1, "model": "m"}
    with pytest.raises(FieldRefused) as raised:
        apply_engine_policy(request, CHAT, REJECT)
    error = raised.value
    assert (error.param, error.field, error.status_code) == (field, field, 400)
    assert error.message == f"{field} steers the inference engine; this tenant may not send it."
    assert request == {field: 1, "model": "m"}  # nothing removed from a refused request


def test_reject_names_the_first_steering_field_in_table_order() -> None:
    with pytest.raises(FieldRefused) as raised:
        apply_engine_policy({"vllm_xargs": {}, "session_id": "s"}, CHAT, REJECT)
    assert raised.value.field == "session_id"


@pytest.mark.parametrize("policy", [DROP, REJECT])
def test_a_body_without_steering_fields_is_untouched(policy: EngineFieldsPolicy) -> None:
    request = {"model": "m", "messages": [], "user": "u", "priority_class": "x"}
    assert apply_engine_policy(request, CHAT, policy) == []
    assert request == {"model": "m", "messages": [], "user": "u", "priority_class": "x"}


@pytest.mark.parametrize(("request_body", "param", "field"), [
    ({"ec_transfer_params": {}}, "ec_transfer_params", "ec_transfer_params"),
    ({"ec_transfer_params": None}, "ec_transfer_params", "ec_transfer_params"),  # present is enough
    ({"vllm_xargs": {"kv_transfer_params": {"do_remote_prefill": True}}}, "vllm_xargs.kv_transfer_params",
     "kv_transfer_params"),
    ({"vllm_xargs": {"ec_transfer_params": 1}}, "vllm_xargs.ec_transfer_params", "ec_transfer_params"),
    ({"vllm_xargs": {"kv_transfer_params": None, "ec_transfer_params": None}}, "vllm_xargs.kv_transfer_params",
     "kv_transfer_params"),
])
@pytest.mark.parametrize("policy", [DROP, REJECT, STORED])
def test_transfer_doors_are_refused_whatever_the_policy(request_body: dict[str, Any], param: str, field: str,
                                                        policy: EngineFieldsPolicy) -> None:
    with pytest.raises(FieldRefused) as raised:
        apply_engine_policy(dict(request_body), CHAT, policy)
    assert (raised.value.param, raised.value.field) == (param, field)
    assert raised.value.message == f"{param} is not allowed."


@pytest.mark.parametrize("xargs", [[], "kv_transfer_params", 1, {"other": 1}, {}])
def test_vllm_xargs_without_a_transfer_member_is_only_a_steering_field(xargs: Any) -> None:
    request = {"vllm_xargs": xargs}
    assert apply_engine_policy(request, CHAT, DROP) == ["vllm_xargs"]
    assert request == {}


@pytest.mark.parametrize("route", [TOKENIZE, MODELS, ROUTES["/admin/reload"], ROUTES["/livez"]])
def test_routes_that_do_not_generate_are_left_alone(route: RouteSpec) -> None:
    request = {"priority": 1, "ec_transfer_params": {}, "store": True}
    assert apply_engine_policy(request, route, REJECT) == []
    assert request == {"priority": 1, "ec_transfer_params": {}, "store": True}


@pytest.mark.parametrize(("field", "value"), [
    ("previous_response_id", "resp_1"),
    ("previous_response_id", ""),  # an empty id is still an id
    ("store", True),
    ("background", True),
    ("store", "no"),  # a wrong type is the type check's 400; here anything but false/null is a store request
])
def test_stored_response_fields_are_refused_unless_the_tenant_allows_them(field: str, value: Any) -> None:
    with pytest.raises(FieldRefused) as raised:
        apply_engine_policy({field: value}, RESPONSES, DROP)
    assert (raised.value.param, raised.value.field) == (field, field)
    assert raised.value.message == f"{field} needs stored responses, which this tenant's policy does not allow."


@pytest.mark.parametrize("request_body", [
    {}, {"store": False}, {"store": None}, {"background": False}, {"previous_response_id": None},
    {"store": None, "background": None, "previous_response_id": None},
])
def test_responses_are_sent_with_store_false_when_the_tenant_keeps_none(request_body: dict[str, Any]) -> None:
    request = dict(request_body)
    assert apply_engine_policy(request, RESPONSES, DROP) == []
    assert request["store"] is False
    assert {key: value for key, value in request.items() if key != "store"} == {
        key: value for key, value in request_body.items() if key != "store"}


def test_a_tenant_with_stored_responses_sends_the_fields_untouched() -> None:
    request = {"previous_response_id": "resp_1", "store": True, "background": True}
    assert apply_engine_policy(request, RESPONSES, STORED) == []
    assert request == {"previous_response_id": "resp_1", "store": True, "background": True}


def test_store_is_not_added_on_routes_other_than_responses() -> None:
    request: dict[str, Any] = {"model": "m"}
    apply_engine_policy(request, CHAT, DROP)
    assert request == {"model": "m"}


def test_transfer_doors_are_checked_before_steering_is_dropped() -> None:
    request = {"priority": 1, "vllm_xargs": {"kv_transfer_params": {}}}
    with pytest.raises(FieldRefused):
        apply_engine_policy(request, CHAT, DROP)
    assert request == {"priority": 1, "vllm_xargs": {"kv_transfer_params": {}}}


def test_steering_is_dropped_before_the_store_check_refuses() -> None:
    request = {"priority": 1, "store": True}
    with pytest.raises(FieldRefused) as raised:
        apply_engine_policy(request, RESPONSES, DROP)
    assert raised.value.field == "store"


def test_every_field_a_refusal_can_name_is_in_the_closed_metric_label_set() -> None:
    assert set(STEERING) | {"kv_transfer_params", "ec_transfer_params", "previous_response_id", "store",
                            "background"} == COUNTED_FIELDS


def test_a_refused_field_is_a_bad_request_with_an_openai_shaped_body() -> None:
    error = FieldRefused("priority is refused.", param="priority", field="priority")
    assert isinstance(error, BadRequest)
    assert error.body() == {"error": {"message": "priority is refused.", "type": "invalid_request_error",
                                      "param": "priority", "code": None}}
