"""Every field of a rewritten request and every refusal's message and parameter (pure).

A client sees the message and `param` of each 400, and the proxy, rollout, balancer and shadow runner read the
other fields of `RewrittenRequest`; each is pinned here so a rewrite that dropped one would fail.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.policy.model import TenantPolicy
from gateway.proxy.rawprompt import parse_json_object
from gateway.proxy.rewrite import AFFINITY_CHARS, RewrittenRequest, lmcache_entries, prompt_prefix, rewrite_request
from gateway.routes import ROUTES
from gateway.salts import Salts
from tests.salt_vectors import UNIT_SECRET, known_salt

SECRET = UNIT_SECRET.encode()
SALTS = Salts(SECRET)
ACME_SALT = known_salt(UNIT_SECRET, "acme", 1)


def tenant(**sections: Any) -> TenantPolicy:
    return TenantPolicy.model_validate({"tenant": "acme", **sections})


def run(body: dict[str, Any], policy: TenantPolicy | None = None, path: str = "/v1/completions",
        header_user: str | None = None) -> RewrittenRequest:
    return rewrite_request(json.dumps(body).encode(), ROUTES[path], policy or tenant(), SALTS, header_user)


def refusal(body: dict[str, Any] | bytes, policy: TenantPolicy | None = None,
            path: str = "/v1/completions") -> BadRequest:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(BadRequest) as raised:
        rewrite_request(raw, ROUTES[path], policy or tenant(), SALTS, None)
    return raised.value


def test_all_fields_of_a_plain_completion() -> None:
    result = run({"model": "m", "prompt": "hello", "temperature": 0})
    assert result == RewrittenRequest(
        request=result.request, upstream_stream=False, client_stream=False, strip_usage=False, assemble=False,
        model="m", user=None, deterministic=True, affinity=f"{ACME_SALT}:hello")
    assert json.loads(result.body) == {"model": "m", "prompt": "hello", "temperature": 0, "cache_salt": ACME_SALT}


def test_a_header_user_wins_over_the_body_user() -> None:
    result = run({"model": "m", "prompt": "x", "user": "body"}, tenant(cache={"isolation": "user"}), header_user="hdr")
    assert result.user == "hdr"
    assert json.loads(result.body)["cache_salt"] == known_salt(UNIT_SECRET, "acme", 1, "hdr")
    assert run({"model": "m", "prompt": "x", "user": "body"}).user == "body"


@pytest.mark.parametrize(("user", "kind"), [(5, "a number"), (["u"], "an array"), ({"id": 1}, "an object")])
def test_a_body_user_of_another_json_type_is_refused(user: object, kind: str) -> None:
    error = refusal({"model": "m", "prompt": "x", "user": user})
    assert (error.message, error.param) == (f"user must be a string (got {kind}).", "user")


@pytest.mark.parametrize("user", ["", None])
def test_a_body_user_must_be_a_non_empty_string(user: object) -> None:
    assert run({"model": "m", "prompt": "x", "user": user}).user is None
    error = refusal({"model": "m", "prompt": "x", "user": user}, tenant(cache={"isolation": "user"}))
    assert (error.message, error.param) == ("This tenant's cache is isolated per user: send the `user` field.", "user")


@pytest.mark.parametrize(("model", "expected"), [("m", "m"), (3, None), (None, None)])
def test_model_is_reported_only_when_it_is_a_string(model: object, expected: str | None) -> None:
    assert run({"model": model, "prompt": "x"}).model == expected
    assert run({"prompt": "x"}).model is None


@pytest.mark.parametrize(
    ("sampling", "deterministic"),
    [({"temperature": 0}, True), ({"temperature": 0.0}, True), ({"seed": 7}, True),
     ({"temperature": 1, "seed": 0}, True), ({}, False), ({"temperature": 0.7}, False),
     ({"temperature": None}, False), ({"seed": None}, False)],
)
def test_deterministic_means_greedy_or_seeded(sampling: dict[str, Any], deterministic: bool) -> None:
    assert run({"model": "m", "prompt": "x", **sampling}).deterministic is deterministic


@pytest.mark.parametrize(
    ("sampling", "message"),
    [({"seed": "7"}, "seed must be an integer (got a string)."),
     ({"seed": 1.5}, "seed must be an integer (got a number)."),
     ({"temperature": "0"}, "temperature must be a number (got a string).")],
)
def test_sampling_fields_of_another_json_type_are_refused(sampling: dict[str, Any], message: str) -> None:
    error = refusal({"model": "m", "prompt": "x", **sampling})
    assert (error.message, error.param) == (message, next(iter(sampling)))


def test_affinity_is_salt_and_prompt_prefix() -> None:
    assert run({"model": "m", "prompt": "p" * 300}).affinity == f"{ACME_SALT}:{'p' * AFFINITY_CHARS}"
    unsalted = run({"model": "m", "prompt": "abc"}, tenant(cache={"isolation": "none"}))
    assert unsalted.affinity == "acme:abc"
    assert AFFINITY_CHARS == 256


@pytest.mark.parametrize(
    ("request_body", "prefix"),
    [({"prompt": "plain"}, "plain"),
     ({"prompt": [1, 2, 3]}, "123"),
     ({"prompt": ["a", "b"]}, "ab"),
     ({"messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]}, "syshi"),
     ({"messages": [{"role": "user", "content": [{"type": "text", "content": "part"}]}]}, "part"),
     ({"messages": [{"role": "user"}]}, ""),
     ({"input": "responses"}, "responses"),
     ({"input": [{"role": "user", "content": "r"}]}, "r"),
     ({"prompt": "first", "messages": [{"content": "second"}], "input": "third"}, "first"),
     ({"messages": [{"content": "second"}], "input": "third"}, "second"),
     ({"prompt": 42}, "42"),
     ({"prompt": None}, "None"),
     ({}, ""),
     ({"prompt": [str(index) for index in range(20)]}, "01234567")],
)
def test_prompt_prefix_reads_whichever_field_carries_the_prompt(request_body: dict[str, Any], prefix: str) -> None:
    assert prompt_prefix(request_body) == prefix


def test_prompt_prefix_is_cut() -> None:
    assert prompt_prefix({"messages": [{"content": "m" * 300}]}) == "m" * AFFINITY_CHARS


def test_refusal_messages_and_params() -> None:
    salt = refusal({"model": "m", "prompt": "x", "cache_salt": "s"})
    assert (salt.message, salt.param) == ("cache_salt is set by the gateway; this tenant may not send one.",
                                          "cache_salt")
    embed = refusal({"model": "m", "input": "x", "kv_transfer_params": {}}, path="/v1/embeddings")
    assert (embed.message, embed.param) == ("kv_transfer_params is only accepted on generation routes.",
                                            "kv_transfer_params")
    shape = refusal({"model": "m", "prompt": "x", "kv_transfer_params": [1]})
    assert (shape.message, shape.param) == ("kv_transfer_params must be an object (got an array).",
                                            "kv_transfer_params")
    foreign = refusal({"model": "m", "prompt": "x", "kv_transfer_params": {"do_remote_decode": True}})
    assert (foreign.message, foreign.param) == ("kv_transfer_params.do_remote_decode is not allowed.",
                                                "kv_transfer_params.do_remote_decode")
    value = refusal({"model": "m", "prompt": "x", "kv_transfer_params": {"max_load_tokens": -1}})
    assert value.message == "kv_transfer_params.max_load_tokens must be a non-negative integer."
    assert value.param in ("max_load_tokens", "kv_transfer_params.max_load_tokens")


def test_json_refusals() -> None:
    with pytest.raises(BadRequest) as raised:
        parse_json_object(b"{")
    assert raised.value.message.startswith("The request body is not valid JSON: ")
    with pytest.raises(BadRequest) as raised:
        parse_json_object(b"[1]")
    assert raised.value.message == "The request body must be a JSON object."
    assert parse_json_object(b'{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


def test_a_null_client_cap_means_no_client_value() -> None:
    body = json.loads(run({"model": "m", "prompt": "x", "kv_transfer_params": {"max_load_tokens": None}},
                          tenant(offload={"max_load_tokens": 9})).body)
    assert body["kv_transfer_params"] == {"max_load_tokens": 9}
    nothing = json.loads(run({"model": "m", "prompt": "x", "kv_transfer_params": {"max_load_tokens": None}}).body)
    assert "kv_transfer_params" not in nothing


def test_both_caps_are_clamped_together() -> None:
    policy = tenant(offload={"max_load_tokens": 100, "max_offload_tokens": 10})
    body = json.loads(run({"model": "m", "prompt": "x",
                           "kv_transfer_params": {"max_load_tokens": 500, "max_offload_tokens": 5}}, policy).body)
    assert body["kv_transfer_params"] == {"max_load_tokens": 100, "max_offload_tokens": 5}


@pytest.mark.parametrize(
    ("options", "sent", "strip"),
    [(None, {"include_usage": True}, True),
     ({"include_usage": False, "continuous_usage_stats": True}, {"include_usage": True, "continuous_usage_stats": True},
      True),
     ({"include_usage": True, "continuous_usage_stats": True}, {"include_usage": True, "continuous_usage_stats": True},
      False)],
)
def test_stream_options_are_merged(options: object, sent: dict[str, Any], strip: bool) -> None:
    request: dict[str, Any] = {"model": "m", "prompt": "x", "stream": True}
    if options is not None:
        request["stream_options"] = options
    result = run(request)
    body = json.loads(result.body)
    assert body["stream_options"] == sent and body["stream"] is True
    assert result.strip_usage is strip and result.client_stream and result.upstream_stream and not result.assemble


def test_stream_options_of_another_json_type_are_refused() -> None:
    junk = refusal({"model": "m", "prompt": "x", "stream": True, "stream_options": "junk"})
    assert (junk.message, junk.param) == ("stream_options must be an object (got a string).", "stream_options")
    usage = refusal({"model": "m", "prompt": "x", "stream": True, "stream_options": {"include_usage": "true"}})
    assert usage.message == "stream_options.include_usage must be a boolean (got a string)."


def test_only_a_json_boolean_stream_is_accepted() -> None:
    result = run({"model": "m", "prompt": "x", "stream": False})
    assert not result.client_stream and not result.upstream_stream
    assert "stream_options" not in json.loads(result.body)
    error = refusal({"model": "m", "prompt": "x", "stream": "yes"})
    assert (error.message, error.param) == ("stream must be a boolean (got a string).", "stream")


def test_chat_with_measure_ttft_is_assembled_and_responses_are_not() -> None:
    chat = run({"model": "m", "messages": [{"role": "user", "content": "x"}]}, tenant(measure_ttft=True),
               "/v1/chat/completions")
    assert chat.assemble and chat.upstream_stream and chat.strip_usage and not chat.client_stream
    responses = run({"model": "m", "input": "x"}, tenant(measure_ttft=True), "/v1/responses")
    assert not responses.assemble and not responses.upstream_stream and not responses.strip_usage
    streamed = run({"model": "m", "input": "x", "stream": True}, tenant(), "/v1/responses")
    assert streamed.upstream_stream and streamed.client_stream and not streamed.strip_usage
    embed = run({"model": "m", "input": "x"}, tenant(measure_ttft=True), "/v1/embeddings")
    assert not embed.assemble and not embed.strip_usage
    assert json.loads(embed.body)["cache_salt"] == ACME_SALT


def test_tenant_isolation_ignores_the_user_field() -> None:
    """Only `isolation: user` salts per user; a `user` field (or header) must not split a tenant's cache."""
    result = run({"model": "m", "prompt": "x", "user": "u1"}, header_user=None)
    assert json.loads(result.body)["cache_salt"] == ACME_SALT
    assert json.loads(run({"model": "m", "prompt": "x"}, header_user="hdr").body)["cache_salt"] == ACME_SALT


# HMAC-SHA256(unit-secret, "kvgate-lmcache-tag-v1\0" + the acme:1 salt), first 32 hex characters, computed with
# `printf 'kvgate-lmcache-tag-v1\0%s' <salt> | openssl dgst -sha256 -hmac unit-secret`.
ACME_TAG = "1175690c4141748b4cdbb95bf88ec582"


def entries(body: dict[str, Any], policy: TenantPolicy | None = None, path: str = "/v1/completions") -> dict[str, Any]:
    """What a pool whose connector is LMCache gets for this request."""
    return lmcache_entries(run(body, policy, path).request, ROUTES[path], policy or tenant(), SECRET)


def test_generation_requests_carry_the_lmcache_tag_of_their_salt() -> None:
    assert entries({"model": "m", "prompt": "x"}) == {"lmcache.tag.kvgate": ACME_TAG}
    assert entries({"model": "m", "input": "x"}, path="/v1/responses") == {"lmcache.tag.kvgate": ACME_TAG}
    assert entries({"model": "m", "input": "x"}, path="/v1/embeddings") == {}
    assert entries({"model": "m", "prompt": "x"}, tenant(cache={"isolation": "none"})) == {}


def test_a_store_cap_of_zero_from_the_client_or_the_policy_skips_saving() -> None:
    skip = {"lmcache.tag.kvgate": ACME_TAG, "lmcache.skip_save": True}
    assert entries({"model": "m", "prompt": "x", "kv_transfer_params": {"max_offload_tokens": 0}}) == skip
    assert entries({"model": "m", "prompt": "x"}, tenant(offload={"max_offload_tokens": 0})) == skip
    assert entries({"model": "m", "prompt": "x", "kv_transfer_params": {"max_offload_tokens": 5}}) == {
        "lmcache.tag.kvgate": ACME_TAG}
