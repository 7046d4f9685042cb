"""The simulator against the H200 measurement of `cache_salt`, `max_offload_tokens` and `max_load_tokens`.

`tests/fixtures/vllm-0.25.0/kv-transfer-params/steps.json` is the ordered list of requests sent straight to a
real vLLM 0.25.0 server with the OffloadingConnector (12 GB CPU tier, 64-token chunks, a 20,336-token GPU
cache, 8,000-token prompts), each with its cached tokens and the change of the offload byte counters. The
simulator, sized the same and started with `--ignore-max-load-tokens`, must reproduce every step; without that
flag it follows the newer rule (0 disables loads) and must differ exactly where `max_load_tokens` was sent.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import MODEL, capture

PROMPT_TOKENS = 8000
BYTES_PER_TOKEN = 147456
H200_SHAPE = ("--offload", "--block-size", "16", "--gpu-blocks", "1271", "--cpu-bytes-to-use", "12000000000",
              "--offload-block-size", "64", "--prefill-us-per-token", "1", "--load-us-per-token", "0.1",
              "--decode-ms-per-token", "0")
STORE = 'vllm:kv_offload_total_bytes_total{engine="0",model_name="%s",transfer_type="GPU_to_CPU"}'
LOAD = 'vllm:kv_offload_total_bytes_total{engine="0",model_name="%s",transfer_type="CPU_to_GPU"}'


def captured_steps() -> list[dict[str, Any]]:
    data: dict[str, Any] = json.loads(capture("kv-transfer-params/steps.json").read_text())
    assert data["plen"] == PROMPT_TOKENS
    steps: list[dict[str, Any]] = data["steps"]
    return steps


def prompt_for(step: str) -> list[int]:
    """The prompt a step names: `A`, `B`, `B2`, `C` return; each pressure step is its own prompt."""
    name = step.split(" ")[1] if "pressure" not in step else step
    seed = sum(ord(char) * 131 ** i for i, char in enumerate(name))
    return [(seed * 7919 + i * 104729) % 31000 + 1000 for i in range(PROMPT_TOKENS)]


def counter(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def replay(base_url: str) -> list[tuple[str, int, float, float]]:
    """Every captured step sent to the simulator: (step, cached tokens, GPU->CPU bytes, CPU->GPU bytes)."""
    results = []
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for step in captured_steps():
            before = client.get("/metrics").text
            body: dict[str, Any] = {"model": MODEL, "prompt": prompt_for(step["step"]), "max_tokens": 1,
                                    "temperature": 0, "cache_salt": step["salt"]}
            if step["kv_transfer_params"] is not None:
                body["kv_transfer_params"] = step["kv_transfer_params"]
            reply = client.post("/v1/completions", json=body)
            assert reply.status_code == 200, reply.text
            after = client.get("/metrics").text
            cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            stored = counter(after, STORE % MODEL) - counter(before, STORE % MODEL)
            loaded = counter(after, LOAD % MODEL) - counter(before, LOAD % MODEL)
            results.append((step["step"], cached, stored, loaded))
    return results


def expected() -> list[tuple[str, int, float, float]]:
    out = []
    for step in captured_steps():
        delta = step["delta"]
        out.append((step["step"], step["cached_tokens"], delta.get(STORE % "m", 0.0), delta.get(LOAD % "m", 0.0)))
    return out


@pytest.fixture(scope="module")
def sim_025(start_sim: StartSim) -> Iterator[ServerProcess]:
    with start_sim(*H200_SHAPE, "--ignore-max-load-tokens") as server:
        yield server


def test_every_captured_step_is_reproduced_with_ignored_max_load_tokens(sim_025: ServerProcess) -> None:
    got = replay(sim_025.url)
    assert got == expected()
    load_capped = [row for row, step in zip(got, captured_steps(), strict=True)
                   if "max_load_tokens" in (step["kv_transfer_params"] or {})]
    assert [row[1] for row in load_capped] == [PROMPT_TOKENS, PROMPT_TOKENS]  # the cap changed nothing


def test_newer_rule_differs_exactly_where_max_load_tokens_was_sent(start_sim: StartSim) -> None:
    with start_sim(*H200_SHAPE) as server:
        got = replay(server.url)
    differing = [step for step, want in zip(got, expected(), strict=True) if step != want]
    assert [step[0] for step in differing] == ["E3-3 C alpha max_load_tokens 0", "E3-5 C alpha max_load_tokens 2048"]
    assert [(step[1], step[3]) for step in differing] == [(0, 0.0), (2048, 2048.0 * BYTES_PER_TOKEN)]
