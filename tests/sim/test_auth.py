"""vLLM's `--api-key` semantics: only /v1, /v2, /inference (and /cohere) are guarded."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import records, words


@pytest.fixture(scope="module")
def keyed_sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    with start_sim("--api-key", "key-one", "--api-key", "key-two") as server:
        yield server


def test_guarded_paths_need_a_bearer_key(keyed_sim: ServerProcess) -> None:
    url = keyed_sim.url
    missing = httpx.get(f"{url}/v1/models")
    assert (missing.status_code, missing.content) == (401, b'{"error":"Unauthorized"}')
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{url}/v1/models", headers={"Authorization": "key-one"}).status_code == 401
    for value in ("Bearer key-one", "bearer key-two"):
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": value}).status_code == 200
    prefixed = httpx.get(f"{url}/v1xyz", headers={"Authorization": "Bearer key-one"})
    assert (httpx.get(f"{url}/v1xyz").status_code, prefixed.status_code) == (401, 404)
    assert httpx.post(f"{url}/inference/v1/generate").status_code == 401
    assert httpx.options(f"{url}/v1/models").status_code != 401


def test_other_paths_stay_open(keyed_sim: ServerProcess) -> None:
    url = keyed_sim.url
    for path in ("/health", "/metrics", "/version", "/load", "/ping", "/sim/requests"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    assert httpx.post(f"{url}/tokenize", json={"prompt": "x"}).status_code == 200
    invocation = httpx.post(f"{url}/invocations", json={"prompt": words(20), "max_tokens": 2}, timeout=30)
    assert invocation.status_code == 200 and invocation.json()["object"] == "text_completion"


def test_rejections_are_recorded_without_the_key(keyed_sim: ServerProcess) -> None:
    httpx.get(f"{keyed_sim.url}/v1/models", headers={"Authorization": "Bearer nope", "X-Request-Id": "auth-1"})
    record = next(r for r in records(keyed_sim.url) if r["request_id"] == "auth-1")
    assert record["status"] == 401 and "authorization" not in record["headers"]
    assert "nope" not in str(record) and len(record["credential_sha256"]["authorization"]) == 64
