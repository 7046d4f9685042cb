"""KV bytes per token (gateway.plan.kvsize) from hand-written expositions and config.json files: every label
shape, every config shape, the dtype table and the disagreement boundary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.plan.kvsize import (
    ConfigError,
    ModelShape,
    ServerCache,
    compare,
    model_shape,
    prefill_seconds_per_token,
    server_cache_from_metrics,
)


def _exposition(**labels: str) -> str:
    inner = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return ("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
            "# TYPE vllm:cache_config_info gauge\n"
            f"vllm:cache_config_info{{{inner}}} 1.0\n")


def test_every_cache_label_is_read() -> None:
    text = _exposition(block_size="16", num_gpu_blocks="1271", kv_cache_size_tokens="20336",
                       kv_cache_memory_bytes="3000000000", kv_offloading_backend="native", kv_offloading_size="12.5",
                       cache_dtype="auto")
    assert server_cache_from_metrics(text) == ServerCache(16, 1271, 20336, 3_000_000_000, "native", 12.5, "auto")


@pytest.mark.parametrize(("labels", "expected"), [
    ({"block_size": "None", "kv_offloading_backend": "None", "kv_offloading_size": "None"},
     ServerCache(None, None, None, None, None, None, None)),
    ({"block_size": "16.0", "num_gpu_blocks": "abc", "kv_offloading_size": "lots", "cache_dtype": ""},
     ServerCache(16, None, None, None, None, None, None)),
    ({"num_gpu_blocks": "1e3"}, ServerCache(None, 1000, None, None, None, None, None)),
])
def test_absent_or_unreadable_labels_are_none_never_zero(labels: dict[str, str], expected: ServerCache) -> None:
    assert server_cache_from_metrics(_exposition(**labels)) == expected


def test_an_exposition_without_the_cache_family_says_nothing() -> None:
    assert server_cache_from_metrics("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n") is None
    assert server_cache_from_metrics("") is None


@pytest.mark.parametrize(("cache", "bytes_per_token", "gpu_tokens"), [
    (ServerCache(16, 100, 1600, 3_200_000, None, None, None), 2000.0, 1600),
    (ServerCache(16, 100, None, 3_200_000, None, None, None), None, 1600),  # tokens from blocks x block size
    (ServerCache(16, None, None, None, None, None, None), None, None),
    (ServerCache(None, 100, None, None, None, None, None), None, None),
    (ServerCache(16, 100, 0, 3_200_000, None, None, None), None, 1600),  # 0 tokens reads as unknown
])
def test_server_derived_figures(cache: ServerCache, bytes_per_token: float | None, gpu_tokens: int | None) -> None:
    assert (cache.bytes_per_token, cache.gpu_tokens) == (bytes_per_token, gpu_tokens)


def _config(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    return path


LLAMA_8B = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_size": 4096,
            "torch_dtype": "bfloat16"}


@pytest.mark.parametrize(("config", "tp", "dtype", "all_ranks", "per_rank"), [
    (LLAMA_8B, 1, None, 32 * 8 * 128 * 2 * 2, 131072.0),  # head_dim = hidden / heads
    (LLAMA_8B, 2, None, 131072, 65536.0),
    (LLAMA_8B, 1, "fp8", 65536, 65536.0),  # the KV cache dtype overrides the model's
    (LLAMA_8B, 1, "auto", 131072, 131072.0),  # auto: the model's dtype
    ({**LLAMA_8B, "head_dim": 256}, 1, None, 262144, 262144.0),  # an explicit head_dim wins
    ({k: v for k, v in LLAMA_8B.items() if k != "num_key_value_heads"}, 1, None, 524288, 524288.0),  # MHA
    ({"text_config": LLAMA_8B, "vision_config": {"num_hidden_layers": 2}}, 1, None, 131072, 131072.0),
    ({**LLAMA_8B, "torch_dtype": None, "dtype": "float32"}, 1, None, 262144, 262144.0),
    ({**LLAMA_8B, "num_hidden_layers": "32"}, 1, None, 131072, 131072.0),  # numbers as strings
])
def test_model_shape_from_config(tmp_path: Path, config: dict[str, Any], tp: int, dtype: str | None,
                                 all_ranks: int, per_rank: float) -> None:
    shape = model_shape(_config(tmp_path, config), tp, dtype)
    assert (shape.bytes_per_token_all_ranks, shape.bytes_per_token) == (all_ranks, per_rank)


@pytest.mark.parametrize(("dtype", "size"), [
    ("float32", 4), ("float", 4), ("float16", 2), ("half", 2), ("bfloat16", 2), ("fp8", 1), ("fp8_e4m3", 1),
    ("fp8_e5m2", 1), ("float8_e4m3fn", 1), ("int8", 1),
])
def test_bytes_per_value_of_each_dtype(dtype: str, size: int) -> None:
    assert ModelShape(layers=1, kv_heads=1, head_dim=1, dtype=dtype, tensor_parallel=1).bytes_per_token == 2 * size


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "cannot read"),
    ([1, 2], "not a JSON object"),
    ({"num_attention_heads": 8, "hidden_size": 512, "torch_dtype": "float16"}, "cannot tell num_hidden_layers"),
    ({"num_hidden_layers": 2, "torch_dtype": "float16"}, "cannot tell num_key_value_heads, head_dim"),
    ({"num_hidden_layers": 2, "num_key_value_heads": 2, "torch_dtype": "float16"}, "cannot tell head_dim"),
    ({"num_hidden_layers": True, "num_attention_heads": 8, "hidden_size": 512, "torch_dtype": "float16"},
     "cannot tell num_hidden_layers"),  # a boolean is not a count
    ({**LLAMA_8B, "torch_dtype": "float64"}, "unknown dtype 'float64'; pass --kv-cache-dtype"),
    ({k: v for k, v in LLAMA_8B.items() if k != "torch_dtype"}, "unknown dtype ''"),
])
def test_config_errors_name_the_problem(tmp_path: Path, content: Any, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ConfigError, match=message):
        model_shape(path, 1, None)


def test_a_missing_config_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        model_shape(tmp_path / "absent.json", 1, None)


@pytest.mark.parametrize(("server", "model", "disagrees"), [
    (None, 100.0, False), (100.0, None, False),
    (102.0, 100.0, False),  # exactly 2 % apart: agreement
    (98.0, 100.0, False),
    (102.1, 100.0, True), (97.9, 100.0, True), (200.0, 100.0, True),
])
def test_disagreement_is_more_than_two_percent_of_the_model_figure(server: float | None, model: float | None,
                                                                   disagrees: bool) -> None:
    sentence = compare(server, model)
    assert (sentence is not None) == disagrees
    if sentence is not None:
        assert "the server's own figure is used" in sentence


def test_disagreement_sentence_gives_both_figures_and_the_gap() -> None:
    assert compare(150_000.0, 100_000.0) == (
        "the server reports 150,000 KV bytes per token but the model shape gives 100,000 (50% apart): check the KV "
        "cache dtype, the tensor-parallel size, or whether the server pads its pages; the server's own figure is used")


def _prefill_text(prefill_sum: float, computed: float, cached: float = 0.0) -> str:
    return ("# TYPE vllm:request_prefill_time_seconds histogram\n"
            f'vllm:request_prefill_time_seconds_sum{{engine="0"}} {prefill_sum}\n'
            f'vllm:request_prefill_time_seconds_count{{engine="0"}} 3\n'
            "# TYPE vllm:prompt_tokens_by_source counter\n"
            f'vllm:prompt_tokens_by_source_total{{source="local_compute"}} {computed}\n'
            f'vllm:prompt_tokens_by_source_total{{source="local_cache_hit"}} {cached}\n')


@pytest.mark.parametrize(("prefill_sum", "computed", "expected"), [
    (2.0, 4000.0, 0.0005), (2.0, 0.0, None), (0.0, 4000.0, None),
])
def test_prefill_seconds_per_computed_token(prefill_sum: float, computed: float, expected: float | None) -> None:
    """Only locally computed tokens count: cached ones cost no prefill."""
    assert prefill_seconds_per_token(_prefill_text(prefill_sum, computed, cached=99_999.0)) == expected


def test_prefill_needs_both_families() -> None:
    assert prefill_seconds_per_token(_exposition(block_size="16")) is None
