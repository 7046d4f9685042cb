"""Request validation and error replies, compared with the captured vLLM errors."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.helpers import MODEL, captured_responses, words


def post(base_url: str, body: Any, path: str = "/v1/completions", **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{base_url}{path}", json=body, timeout=30, **kwargs)


def error_of(reply: httpx.Response) -> dict[str, Any]:
    body: dict[str, Any] = reply.json()
    assert list(body) == ["error"] and list(body["error"]) == ["message", "type", "param", "code"]
    assert body["error"]["code"] == reply.status_code
    error: dict[str, Any] = body["error"]
    return error


@pytest.mark.parametrize(("case", "salt"), [("err_cache_salt_empty", ""), ("err_cache_salt_int", 5)])
def test_captured_cache_salt_errors(sim: ServerProcess, case: str, salt: object) -> None:
    reply = post(sim.url, {"model": MODEL, "prompt": "x", "max_tokens": 4, "cache_salt": salt})
    expected = captured_responses()[case]
    assert reply.status_code == expected["status"]
    error = error_of(reply)
    assert (error["type"], error["param"]) == (expected["body"]["error"]["type"], "cache_salt")
    assert "must be a non-empty string if provided" in error["message"]


@pytest.mark.parametrize("salt", ["a" * 129, "a@b", "a/b", "a\\b", "a\x00b"])
def test_cache_salt_limits(sim: ServerProcess, salt: str) -> None:
    reply = post(sim.url, {"prompt": "x", "cache_salt": salt}, "/v1/chat/completions")
    assert reply.status_code == 400
    assert error_of(reply)["param"] == "cache_salt"


def test_cache_salt_of_128_chars_is_accepted(sim: ServerProcess) -> None:
    assert post(sim.url, {"prompt": words(20), "max_tokens": 1, "cache_salt": "s" * 128}).status_code == 200


def test_kv_transfer_params_must_be_an_object(sim: ServerProcess) -> None:
    reply = post(sim.url, {"model": MODEL, "prompt": "x", "kv_transfer_params": "abc"})
    expected = captured_responses()["err_kvtp_not_object"]["body"]["error"]
    error = error_of(reply)
    assert reply.status_code == 400 and (error["type"], error["param"]) == (expected["type"], expected["param"])


@pytest.mark.parametrize("params", [{"max_offload_tokens": -1}, {"max_load_tokens": "x"},
                                    {"max_load_tokens": True}, {"max_offload_tokens": 0, "other": 1}])
def test_invalid_caps_are_ignored(sim: ServerProcess, params: dict[str, Any]) -> None:
    reply = post(sim.url, {"prompt": words(20), "max_tokens": 1, "kv_transfer_params": params})
    assert reply.status_code == 200 and reply.json()["kv_transfer_params"] is None


def test_stream_options_without_stream(sim: ServerProcess) -> None:
    reply = post(sim.url, {"prompt": "x", "stream_options": {"include_usage": True}})
    assert reply.status_code == 400 and "stream=True" in error_of(reply)["message"]


def test_content_type_must_be_json(sim: ServerProcess) -> None:
    reply = httpx.post(f"{sim.url}/v1/chat/completions", content=b'{"prompt":"x"}',
                       headers={"content-type": "text/plain"})
    assert reply.status_code == 400 and error_of(reply)["type"] == "Bad Request"


def test_malformed_json(sim: ServerProcess) -> None:
    reply = httpx.post(f"{sim.url}/v1/completions", content=b"{bad", headers={"content-type": "application/json"})
    expected = captured_responses()["err_bad_json"]
    assert reply.status_code == expected["status"]
    assert error_of(reply)["param"] == expected["body"]["error"]["param"] == "body.1"


def test_unknown_model_is_the_captured_404(sim: ServerProcess) -> None:
    reply = post(sim.url, {"model": "nope", "prompt": "x", "max_tokens": 4})
    assert reply.status_code == 404
    assert reply.json() == captured_responses()["err_unknown_model"]["body"]


def test_engine_side_errors(sim: ServerProcess) -> None:
    overflow = post(sim.url, {"prompt": [5] * 16380, "max_tokens": 100})
    captured = captured_responses()
    assert overflow.json() == captured["err_context_overflow"]["body"]
    oov = post(sim.url, {"prompt": [1, 40000], "max_tokens": 4})
    assert oov.json() == captured["err_token_oov"]["body"]


def test_unknown_route_and_method(sim: ServerProcess) -> None:
    assert httpx.get(f"{sim.url}/v1/nothing").status_code == 404
    wrong = httpx.get(f"{sim.url}/v1/completions")
    assert wrong.status_code == 405 and error_of(wrong)["message"] == "Method Not Allowed"
