"""Failed CPU-tier loads, as vLLM's kv_load_failure_policy `fail` and `recompute` describe them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import MODEL, cached_tokens, complete, metric_value, records, sse_data, words
from tests.sim.test_offload import BYTES_PER_TOKEN, CPU_CHUNKS

FAIL = "[[sim:fail-load]]"
FLAGS = ("--offload", "--gpu-blocks", "64", "--cpu-bytes-to-use", str(CPU_CHUNKS * 64 * BYTES_PER_TOKEN),
         "--decode-ms-per-token", "0")
LOAD_BYTES = "vllm:kv_offload_load_bytes_total"


@pytest.fixture(scope="module")
def failing_sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    with start_sim(*FLAGS) as server:
        yield server


def state(url: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{url}/sim/state", timeout=10).json()
    return found


def offloaded_and_evicted(url: str, prompt: str) -> None:
    """`prompt` in the CPU tier and out of the GPU cache (two 512-token prompts fill the 64 GPU blocks)."""
    complete(url, prompt)
    complete(url, words(512))
    complete(url, words(512))


def test_fail_policy_errors_before_the_first_token(failing_sim: ServerProcess) -> None:
    url = failing_sim.url
    prompt = FAIL + words(512 - len(FAIL))
    offloaded_and_evicted(url, prompt)
    failures, loaded = state(url)["load_failures"], metric_value(url, LOAD_BYTES)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4}
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
    assert reply.status_code == 500
    assert reply.json()["error"]["code"] == 500
    stream = httpx.post(f"{url}/v1/completions", json={**body, "stream": True}, timeout=30)
    assert stream.status_code == 200  # vLLM sends a stream's headers before the engine runs
    events = sse_data(stream.text)
    assert [event for event in events if event != "[DONE]"] == [events[0]]
    assert events[0]["error"]["code"] == 500 and events[-1] == "[DONE]"
    assert state(url)["load_failures"] == failures + 2
    assert metric_value(url, LOAD_BYTES) == loaded  # a failed load moved nothing
    generations = [r for r in records(url) if r["path"] == "/v1/completions"]
    assert [r["outcome"] for r in generations[-2:]] == ["load_failed", "load_failed"]


def test_a_failed_load_leaves_no_gpu_blocks_behind(failing_sim: ServerProcess) -> None:
    url = failing_sim.url
    prompt = FAIL + words(512 - len(FAIL))
    offloaded_and_evicted(url, prompt)
    reply = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 4}, timeout=30)
    assert reply.status_code == 500
    # The blocks the failed request was filling were dropped, so a recompute finds nothing on the GPU either.
    result = complete(url, prompt, kv_transfer_params={"max_load_tokens": 0})
    assert cached_tokens(result) == 0


def test_without_a_needed_load_the_directive_changes_nothing(failing_sim: ServerProcess) -> None:
    url = failing_sim.url
    prompt = FAIL + words(512 - len(FAIL))
    failures = state(url)["load_failures"]
    complete(url, prompt)
    assert cached_tokens(complete(url, prompt)) == 496  # a GPU hit needs no load
    offloaded_and_evicted(url, prompt)
    assert cached_tokens(complete(url, prompt, kv_transfer_params={"max_load_tokens": 0})) == 0
    assert state(url)["load_failures"] == failures


def test_recompute_policy_answers_from_a_prefill(start_sim: StartSim) -> None:
    with start_sim(*FLAGS, "--load-failure-policy", "recompute") as server:
        url = server.url
        prompt = FAIL + words(512 - len(FAIL))
        offloaded_and_evicted(url, prompt)
        loaded = metric_value(url, LOAD_BYTES)
        assert cached_tokens(complete(url, prompt)) == 0
        assert metric_value(url, LOAD_BYTES) == loaded
        assert state(url)["load_failures"] == 1
        assert state(url)["load_failure_policy"] == "recompute"


def test_fail_loads_rate_one_fails_every_load(start_sim: StartSim) -> None:
    with start_sim(*FLAGS, "--fail-loads", "1") as server:
        url = server.url
        prompt = words(512)
        offloaded_and_evicted(url, prompt)
        reply = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=30)
        assert reply.status_code == 500
        assert state(url)["load_failures"] == 1


def test_version_and_flag_validation(start_sim: StartSim) -> None:
    with start_sim("--vllm-version", "0.32.0") as server:
        assert httpx.get(f"{server.url}/version", timeout=10).json() == {"version": "0.32.0"}
