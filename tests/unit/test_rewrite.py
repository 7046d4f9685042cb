"""Body rewriting: salts per policy, caps clamped, foreign keys refused, the rest untouched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.errors import BadRequest
from gateway.policy.model import TenantPolicy
from gateway.proxy.rewrite import rewrite_request
from gateway.routes import ROUTES
from gateway.salts import Salts
from tests.salt_vectors import UNIT_SECRET, known_salt

SECRET = UNIT_SECRET.encode()
SALTS = Salts(SECRET)
CHAT = ROUTES["/v1/chat/completions"]
COMPLETIONS = ROUTES["/v1/completions"]
RESPONSES = ROUTES["/v1/responses"]
EMBEDDINGS = ROUTES["/v1/embeddings"]


def tenant(**sections: Any) -> TenantPolicy:
    return TenantPolicy.model_validate({"tenant": "acme", **sections})


def rewrite(body: dict[str, Any], policy: TenantPolicy, route: Any = CHAT, user: str | None = None) -> dict[str, Any]:
    result = rewrite_request(json.dumps(body).encode(), route, policy, SALTS, user)
    parsed: dict[str, Any] = json.loads(result.body)
    return parsed


def test_salt_is_derived_per_tenant_and_epoch() -> None:
    body = rewrite({"model": "m", "messages": []}, tenant(cache={"salt_epoch": 3}))
    assert body["cache_salt"] == known_salt(UNIT_SECRET, "acme", 3)
    assert len(body["cache_salt"]) == 64


def test_per_user_salt_uses_the_user_field() -> None:
    policy = tenant(cache={"isolation": "user"})
    body = rewrite({"model": "m", "prompt": "x", "user": "u1"}, policy, COMPLETIONS)
    assert body["cache_salt"] == known_salt(UNIT_SECRET, "acme", 1, "u1")


def test_per_user_salt_needs_a_user() -> None:
    with pytest.raises(BadRequest) as raised:
        rewrite({"model": "m", "prompt": "x"}, tenant(cache={"isolation": "user"}), COMPLETIONS)
    assert raised.value.param == "user"


def test_isolation_none_removes_the_salt() -> None:
    body = rewrite({"model": "m", "prompt": "x", "cache_salt": "mine"},
                   tenant(cache={"isolation": "none", "client_salt": "replace"}), COMPLETIONS)
    assert "cache_salt" not in body


def test_client_salt_rejected_by_default() -> None:
    with pytest.raises(BadRequest) as raised:
        rewrite({"model": "m", "messages": [], "cache_salt": "other-tenant"}, tenant())
    assert raised.value.param == "cache_salt"


def test_client_salt_replaced_when_policy_says_so() -> None:
    body = rewrite({"model": "m", "messages": [], "cache_salt": "other"}, tenant(cache={"client_salt": "replace"}))
    assert body["cache_salt"] == known_salt(UNIT_SECRET, "acme", 1)


@pytest.mark.parametrize(
    ("client", "cap", "expected"),
    [(None, 100, 100), (50, 100, 50), (500, 100, 100), (500, None, 500), (0, None, 0), (None, 0, 0)],
)
def test_caps_are_the_smaller_value(client: int | None, cap: int | None, expected: int) -> None:
    params = {} if client is None else {"max_offload_tokens": client}
    body = rewrite({"model": "m", "messages": [], "kv_transfer_params": params},
                   tenant(offload={"max_offload_tokens": cap}))
    assert body["kv_transfer_params"] == {"max_offload_tokens": expected}


def test_null_cap_and_no_client_value_adds_nothing() -> None:
    body = rewrite({"model": "m", "messages": []}, tenant())
    assert "kv_transfer_params" not in body


@pytest.mark.parametrize("params", [{"do_remote_prefill": True}, {"kv_load_tiers": []}, "abc", [1]])
def test_foreign_or_malformed_transfer_params_are_refused(params: object) -> None:
    with pytest.raises(BadRequest) as raised:
        rewrite({"model": "m", "messages": [], "kv_transfer_params": params}, tenant())
    assert raised.value.param is not None and raised.value.param.startswith("kv_transfer_params")


@pytest.mark.parametrize("value", [-1, 1.5, True, "10"])
def test_invalid_cap_values_are_refused(value: object) -> None:
    with pytest.raises(BadRequest):
        rewrite({"model": "m", "messages": [], "kv_transfer_params": {"max_load_tokens": value}}, tenant())


def test_rest_of_body_is_unchanged() -> None:
    original = {"model": "m", "messages": [{"role": "user", "content": "hé"}], "temperature": 0.3,
                "logit_bias": {"12": -1}, "extra_vendor_field": [1, {"a": None}]}
    body = rewrite(dict(original), tenant())
    body.pop("cache_salt")
    assert body == original


def test_stream_usage_requested_upstream_and_marked_for_stripping() -> None:
    result = rewrite_request(b'{"model":"m","prompt":"x","stream":true}', COMPLETIONS, tenant(), SALTS, None)
    assert json.loads(result.body)["stream_options"] == {"include_usage": True}
    assert result.strip_usage and result.upstream_stream and result.client_stream


def test_client_that_asked_for_usage_keeps_it() -> None:
    raw = b'{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true}}'
    result = rewrite_request(raw, COMPLETIONS, tenant(), SALTS, None)
    assert not result.strip_usage


def test_non_stream_request_never_gets_stream_options() -> None:
    result = rewrite_request(b'{"model":"m","prompt":"x"}', COMPLETIONS, tenant(), SALTS, None)
    assert "stream_options" not in json.loads(result.body)
    assert not result.upstream_stream


def test_measure_ttft_streams_upstream_for_non_streaming_clients() -> None:
    result = rewrite_request(b'{"model":"m","prompt":"x"}', COMPLETIONS, tenant(measure_ttft=True), SALTS, None)
    body = json.loads(result.body)
    assert result.assemble and result.upstream_stream and not result.client_stream
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}


def test_responses_api_gets_no_stream_options() -> None:
    result = rewrite_request(b'{"model":"m","input":"x","stream":true}', RESPONSES, tenant(), SALTS, None)
    assert "stream_options" not in json.loads(result.body)


def test_embeddings_get_the_salt_but_no_transfer_params() -> None:
    assert "cache_salt" in rewrite({"model": "m", "input": "x"}, tenant(), EMBEDDINGS)
    with pytest.raises(BadRequest):
        rewrite({"model": "m", "input": "x", "kv_transfer_params": {}}, tenant(), EMBEDDINGS)


@pytest.mark.parametrize("raw", [b"{", b"[1,2]", b'"text"', b""])
def test_non_object_bodies_are_refused(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        rewrite_request(raw, CHAT, tenant(), SALTS, None)
