"""Strict field types and the engine-steering body fields, through a real gateway in front of the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY, UPSTREAM_KEY_ENV, Stack, standard_policy
from tests.harness import new_secret, run_gateway
from tests.procs import ServerProcess


@pytest.fixture(scope="module")
def fields_stack(sim: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("fields")
    policy = standard_policy(root / "policies", sim.url)
    policy.add_tenant("strict", engine_fields={"steering": "reject"})
    policy.add_tenant("stateful", engine_fields={"responses_store": True})
    policy.write()
    secret = new_secret()
    with run_gateway(policy.root, root / "gateway.log", secret, {UPSTREAM_KEY_ENV: UPSTREAM_KEY}) as gateway:
        yield Stack(gateway=gateway, sim=sim, policy=policy, secret=secret)


def post(stack: Stack, tenant: str, path: str, body: dict[str, Any]) -> httpx.Response:
    with stack.client(tenant) as client:
        return client.post(path, json=body)


def completion(stack: Stack, tenant: str, **extra: Any) -> httpx.Response:
    body = {"model": SIM_MODEL, "prompt": "fields", "max_tokens": 3, **extra}
    return post(stack, tenant, "/v1/completions", body)


def assert_refused(reply: httpx.Response, param: str) -> None:
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert error["message"]


@pytest.mark.parametrize(("extra", "param"), [
    ({"stream": "true"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"stream": True, "stream_options": "yes"}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": 1}}, "stream_options.continuous_usage_stats"),
    ({"temperature": "0"}, "temperature"),
    ({"temperature": False}, "temperature"),
    ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"),
    ({"seed": True}, "seed"),
    ({"user": 42}, "user"),
    ({"user": ["a"]}, "user"),
    ({"kv_transfer_params": [1]}, "kv_transfer_params"),
    ({"kv_transfer_params": {"max_load_tokens": "5"}}, "kv_transfer_params.max_load_tokens"),
    ({"kv_transfer_params": {"max_offload_tokens": 1.0}}, "kv_transfer_params.max_offload_tokens"),
])
def test_loose_types_of_interpreted_fields_are_400(fields_stack: Stack, extra: dict[str, Any], param: str) -> None:
    assert_refused(completion(fields_stack, "acme", **extra), param)


def test_nulls_mean_absent_and_exact_types_pass(fields_stack: Stack) -> None:
    reply = completion(fields_stack, "acme", stream=None, stream_options=None, temperature=None, seed=None,
                       user=None)
    assert reply.status_code == 200, reply.text
    reply = completion(fields_stack, "acme", temperature=0, seed=3, user="u")
    assert reply.status_code == 200, reply.text


def test_vllm_xargs_transfer_params_are_refused_for_every_tenant(fields_stack: Stack) -> None:
    smuggled = {"kv_transfer_params": {"max_load_tokens": 99999, "remote_host": "10.0.0.9"}}
    for tenant in ("acme", "strict"):
        assert_refused(completion(fields_stack, tenant, vllm_xargs=smuggled), "vllm_xargs.kv_transfer_params")
    assert_refused(completion(fields_stack, "acme", vllm_xargs={"ec_transfer_params": {}}),
                   "vllm_xargs.ec_transfer_params")
    assert_refused(completion(fields_stack, "acme", ec_transfer_params={"x": 1}), "ec_transfer_params")


STEERING = {"priority": -100, "session_id": "s1", "request_id": "mine", "data_parallel_rank": 0,
            "vllm_xargs": {"session_id": "s2"}}


def test_steering_fields_are_dropped_by_default(fields_stack: Stack) -> None:
    for path, body in (("/v1/completions", {"prompt": "steer", "max_tokens": 2}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "steer"}]}),
                       ("/v1/embeddings", {"input": "steer"})):
        reply = post(fields_stack, "acme", path, {"model": SIM_MODEL, **body, **STEERING})
        assert reply.status_code == 200, reply.text
        seen = fields_stack.sim_request(reply.headers["x-request-id"])
        body_keys = seen["body_keys"]
        assert isinstance(body_keys, list)
        keys = set(body_keys)
        assert keys and not keys & set(STEERING), keys
    metrics = metrics_text(fields_stack)
    for field in STEERING:
        assert f'kvgate_engine_fields_total{{action="dropped",field="{field}",tenant="acme"}} 3.0' in metrics


@pytest.mark.parametrize("field", sorted(STEERING))
def test_steering_fields_are_refused_when_policy_says_reject(fields_stack: Stack, field: str) -> None:
    assert_refused(completion(fields_stack, "strict", **{field: STEERING[field]}), field)


def test_refusals_are_counted(fields_stack: Stack) -> None:
    completion(fields_stack, "strict", priority=1)
    assert 'kvgate_engine_fields_total{action="refused",field="priority",tenant="strict"}' in metrics_text(
        fields_stack)


def responses(stack: Stack, tenant: str, **extra: Any) -> httpx.Response:
    return post(stack, tenant, "/v1/responses", {"model": SIM_MODEL, "input": "hi", "max_output_tokens": 3, **extra})


@pytest.mark.parametrize(("extra", "param"), [
    ({"previous_response_id": "resp_other_tenant"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"background": True}, "background"),
    ({"store": "false"}, "store"),
])
def test_responses_state_is_refused_by_default(fields_stack: Stack, extra: dict[str, Any], param: str) -> None:
    assert_refused(responses(fields_stack, "acme", **extra), param)


def test_responses_are_never_stored_by_default(fields_stack: Stack) -> None:
    reply = responses(fields_stack, "acme")
    assert reply.status_code == 200, reply.text
    assert fields_stack.sim_request(reply.headers["x-request-id"])["store"] is False


def test_responses_state_passes_when_policy_allows(fields_stack: Stack) -> None:
    reply = responses(fields_stack, "stateful", store=True)
    assert reply.status_code == 200, reply.text
    assert fields_stack.sim_request(reply.headers["x-request-id"])["store"] is True


def metrics_text(stack: Stack) -> str:
    return httpx.get(f"{stack.url}/metrics", headers={"Authorization": f"Bearer {stack.key('ops')}"}).text
