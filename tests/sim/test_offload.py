"""The CPU offload tier: stores, loads after GPU eviction, LRU, the per-request caps, and its metrics."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.procs import ServerProcess
from tests.sim.conftest import StartSim
from tests.sim.helpers import cached_tokens, capture, complete, metric_value, record_for, words
from tests.sim.test_metrics import families

BYTES_PER_TOKEN = 147456
CPU_CHUNKS = 32


@pytest.fixture(scope="module")
def offload_sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    """64 GPU blocks (two 512-token prompts) and a CPU tier of 32 chunks of 64 tokens (four prompts)."""
    flags = ("--offload", "--gpu-blocks", "64", "--cpu-bytes-to-use", str(CPU_CHUNKS * 64 * BYTES_PER_TOKEN),
             "--decode-ms-per-token", "0")
    with start_sim(*flags) as server:
        yield server


def stored_chunks(url: str) -> int:
    value: int = httpx.get(f"{url}/sim/state").json()["cpu"]["stored_chunks"]
    return value


def evict_from_gpu(url: str, prompts: int = 2) -> None:
    for _ in range(prompts):
        complete(url, words(512))


def caps(**values: Any) -> dict[str, Any]:
    return {"kv_transfer_params": values}


def test_return_after_gpu_eviction_loads_from_cpu(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    prompt = words(512)
    assert cached_tokens(complete(url, prompt)) == 0
    assert cached_tokens(complete(url, prompt)) == 496
    evict_from_gpu(url)
    before = {name: metric_value(url, name) for name in (
        "vllm:external_prefix_cache_hits_total", "vllm:kv_offload_load_bytes_total")}
    host = metric_value(url, "vllm:prompt_tokens_cached_by_source_total", {"source": "host"})
    assert cached_tokens(complete(url, prompt)) == 512
    assert metric_value(url, "vllm:external_prefix_cache_hits_total") - before[
        "vllm:external_prefix_cache_hits_total"] == 512
    assert metric_value(url, "vllm:kv_offload_load_bytes_total") - before[
        "vllm:kv_offload_load_bytes_total"] == 512 * BYTES_PER_TOKEN
    assert metric_value(url, "vllm:prompt_tokens_cached_by_source_total", {"source": "host"}) - host == 512


def test_ttft_model_charges_each_tier(offload_sim: ServerProcess) -> None:
    """base 5 ms; 40 us per computed, 1 us per GPU-cached and 4 us per CPU-loaded token (the defaults)."""
    url = offload_sim.url
    prompt = words(512)
    planned = []
    for step in ("cold", "gpu", "cpu"):
        if step == "cpu":
            evict_from_gpu(url)
        request_id = f"ttft-{step}-{uuid.uuid4().hex[:8]}"
        complete(url, prompt, headers={"X-Request-Id": request_id})
        record = record_for(url, request_id)
        assert record is not None
        planned.append((record["gpu_hit_tokens"], record["loaded_tokens"], record["planned_prefill_ms"]))
    expected = [(0, 0, 5 + 512 * 0.04), (496, 0, 5 + 496 * 0.001 + 16 * 0.04), (0, 512, 5 + 512 * 0.004)]
    assert [(g, c) for g, c, _ in planned] == [(g, c) for g, c, _ in expected]
    assert [ms for _, _, ms in planned] == pytest.approx([ms for _, _, ms in expected])


def test_gpu_hit_tail_shorter_than_a_chunk_is_not_loaded(offload_sim: ServerProcess) -> None:
    prompt = words(500)
    complete(offload_sim.url, prompt)
    assert cached_tokens(complete(offload_sim.url, prompt)) == 496


def test_max_load_tokens(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    prompt = words(512)
    complete(url, prompt)
    evict_from_gpu(url)
    assert cached_tokens(complete(url, prompt, **caps(max_load_tokens=0))) == 0
    evict_from_gpu(url)
    assert cached_tokens(complete(url, prompt, **caps(max_load_tokens=200))) == 192


def test_max_offload_tokens(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    before = stored_chunks(url)
    store_bytes = metric_value(url, "vllm:kv_offload_store_bytes_total")
    never, partly = words(512), words(512)
    complete(url, never, **caps(max_offload_tokens=0))
    assert stored_chunks(url) == before and metric_value(url, "vllm:kv_offload_store_bytes_total") == store_bytes
    complete(url, partly, **caps(max_offload_tokens=130))
    evict_from_gpu(url)
    assert cached_tokens(complete(url, partly)) == 128
    assert cached_tokens(complete(url, never)) == 0


def test_invalid_caps_are_ignored(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    prompt = words(512)
    complete(url, prompt, **caps(max_offload_tokens=-1))
    evict_from_gpu(url)
    assert cached_tokens(complete(url, prompt, **caps(max_load_tokens="all"))) == 512


def test_cpu_tier_evicts_least_recently_used(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    oldest = words(512)
    complete(url, oldest)
    evict_from_gpu(url, prompts=CPU_CHUNKS // 8)
    assert stored_chunks(url) == CPU_CHUNKS
    assert cached_tokens(complete(url, oldest)) == 0


def test_reset_with_reset_external_clears_the_cpu_tier(offload_sim: ServerProcess) -> None:
    url = offload_sim.url
    complete(url, words(128))
    assert stored_chunks(url) > 0
    assert httpx.post(f"{url}/reset_prefix_cache").json() == {"success": True}
    assert stored_chunks(url) > 0
    assert httpx.post(f"{url}/reset_prefix_cache?reset_external=true").json() == {"success": True}
    assert stored_chunks(url) == 0


def test_offload_families_match_the_capture(offload_sim: ServerProcess) -> None:
    mine = families(httpx.get(f"{offload_sim.url}/metrics").text)
    captured = families(capture("metrics/offload_metrics_after.txt").read_text())
    offload = {name: value for name, value in captured.items() if name.startswith("vllm:kv_offload")}
    assert offload and all(mine.get(name) == value for name, value in offload.items())
