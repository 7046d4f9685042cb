"""The GPU prefix cache seen through `cached_tokens`, and deterministic generation."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import MODEL, cached_tokens, complete, words


@pytest.fixture(scope="module")
def small_sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    """20 GPU blocks of 16 tokens: two 160-token prompts fill it."""
    with start_sim("--gpu-blocks", "20", "--decode-ms-per-token", "0") as server:
        yield server


def test_repeat_hits_all_but_the_last_block(sim: ServerProcess) -> None:
    prompt = words(1000)
    assert cached_tokens(complete(sim.url, prompt)) == 0
    assert cached_tokens(complete(sim.url, prompt)) == 992
    assert cached_tokens(complete(sim.url, prompt + words(100))) == 992


def test_token_id_prompts_and_block_multiples(sim: ServerProcess) -> None:
    prompt = [1000 + i for i in range(64)]
    complete(sim.url, prompt)
    assert cached_tokens(complete(sim.url, prompt)) == 48
    assert cached_tokens(complete(sim.url, prompt[:40])) == 32


def test_salts_isolate_and_hit_on_reuse(sim: ServerProcess) -> None:
    prompt = words(320)
    complete(sim.url, prompt)
    assert cached_tokens(complete(sim.url, prompt, cache_salt="tenant-a")) == 0
    assert cached_tokens(complete(sim.url, prompt, cache_salt="tenant-b")) == 0
    assert cached_tokens(complete(sim.url, prompt, cache_salt="tenant-a")) == 304
    assert cached_tokens(complete(sim.url, prompt)) == 304


def test_lru_eviction_of_unreferenced_blocks(small_sim: ServerProcess) -> None:
    url = small_sim.url
    first, second, third = words(160, "a" * 32), words(160, "b" * 32), words(160, "c" * 32)
    for prompt in (first, second):
        complete(url, prompt, max_tokens=1)
    assert cached_tokens(complete(url, first, max_tokens=1)) == 144
    complete(url, third, max_tokens=1)
    assert cached_tokens(complete(url, first, max_tokens=1)) == 144
    assert cached_tokens(complete(url, second, max_tokens=1)) == 0
    assert cached_tokens(complete(url, third, max_tokens=1)) == 0


def test_reset_prefix_cache_clears_gpu_blocks(small_sim: ServerProcess) -> None:
    prompt = words(64)
    complete(small_sim.url, prompt, max_tokens=1)
    reply = httpx.post(f"{small_sim.url}/reset_prefix_cache")
    assert reply.json() == {"success": True}
    assert httpx.get(f"{small_sim.url}/sim/state").json()["gpu"]["cached_blocks"] == 0
    assert cached_tokens(complete(small_sim.url, prompt, max_tokens=1)) == 0


def test_generated_blocks_are_cached_for_the_next_turn(sim: ServerProcess) -> None:
    question = words(50)
    messages = [{"role": "user", "content": question}]
    first = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30,
                       json={"messages": messages, "max_tokens": 40, "temperature": 0}).json()
    answer = first["choices"][0]["message"]["content"]
    follow_up = [*messages, {"role": "assistant", "content": answer}, {"role": "user", "content": "more"}]
    second = httpx.post(f"{sim.url}/v1/chat/completions", timeout=30,
                        json={"messages": follow_up, "max_tokens": 1}).json()
    computed = first["usage"]["prompt_tokens"] + 40 - 1
    assert cached_tokens(second) == computed // 16 * 16


def test_greedy_and_seeded_outputs_are_deterministic(sim: ServerProcess) -> None:
    prompt = words(48)

    def text(**options: object) -> str:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, **options}
        reply = httpx.post(f"{sim.url}/v1/completions", json=body, timeout=30)
        value: str = reply.json()["choices"][0]["text"]
        return value

    assert text(temperature=0) == text(temperature=0, cache_salt="other")
    assert text(temperature=0.8, seed=7) == text(temperature=0.8, seed=7) != text(temperature=0.8, seed=8)
    assert len({text(temperature=1.0) for _ in range(3)}) > 1


def test_corrupt_output_changes_deterministic_text(sim: ServerProcess, start_sim: StartSim) -> None:
    prompt = words(40)

    def text(url: str) -> str:
        value: str = complete(url, prompt, max_tokens=20)["choices"][0]["text"]
        return value

    with start_sim("--corrupt-output") as corrupt:
        wrong = text(corrupt.url)
        assert wrong == text(corrupt.url)
    assert wrong != text(sim.url) and len(wrong) == 20
