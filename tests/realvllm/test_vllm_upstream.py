"""The real vLLM itself behaves as the gateway assumes (vllm-facts.md): these are the ground truths the
gateway tests build on, checked directly against the server without the gateway."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.realvllm.kv_events import KvEventWatcher
from tests.realvllm.prompts import long_prompt
from tests.realvllm.tooling.vllm_server import BLOCK_SIZE, RunningVllm

pytestmark = pytest.mark.realvllm


def completion(client: httpx.Client, model: str, prompt: str, **extra: Any) -> dict[str, Any]:
    reply = client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 2, **extra})
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def cached_tokens(body: dict[str, Any]) -> int:
    count: int = body["usage"]["prompt_tokens_details"]["cached_tokens"]
    return count


def test_inference_needs_the_key_and_health_does_not(real_vllm: RunningVllm) -> None:
    assert httpx.get(f"{real_vllm.url}/health").status_code == 200
    assert httpx.get(f"{real_vllm.url}/v1/models").status_code == 401
    models = httpx.get(f"{real_vllm.url}/v1/models", headers=real_vllm.auth_headers()).json()
    assert [model["id"] for model in models["data"]] == [real_vllm.model_name]


def test_cache_salt_partitions_the_prefix_cache(real_vllm: RunningVllm, vllm_http: httpx.Client) -> None:
    prompt = long_prompt()
    first = completion(vllm_http, real_vllm.model_name, prompt, cache_salt="salt-one")
    repeat = completion(vllm_http, real_vllm.model_name, prompt, cache_salt="salt-one")
    other_salt = completion(vllm_http, real_vllm.model_name, prompt, cache_salt="salt-two")

    assert first["usage"]["prompt_tokens"] > 900
    assert cached_tokens(first) == 0
    assert cached_tokens(repeat) > 0
    assert cached_tokens(repeat) % BLOCK_SIZE == 0
    assert cached_tokens(other_salt) == 0


def test_kv_events_carry_the_salt_on_stored_blocks(
    real_vllm: RunningVllm, vllm_http: httpx.Client, kv_events: KvEventWatcher
) -> None:
    salt = f"probe-{uuid.uuid4().hex}"
    seen_before = kv_events.drain()
    completion(vllm_http, real_vllm.model_name, long_prompt(items=40), cache_salt=salt)

    stored = kv_events.wait_for(lambda event: event.kind == "BlockStored" and event.salts()[:1] == [salt],
                                since=seen_before)

    assert stored.fields["parent_block_hash"] is None  # the request's first block is a chain root
    assert stored.fields["block_size"] == BLOCK_SIZE
    # Only the root block names the salt; the blocks after it inherit it through the hash chain.
    assert len(stored.block_hashes) > 1
    assert stored.salts() == [salt] + [None] * (len(stored.block_hashes) - 1)
