"""KV bytes per token and the cache shape, from the server's own `/metrics` or from a model's config.json.

`vllm:cache_config_info` carries `kv_cache_memory_bytes`, `kv_cache_size_tokens`, `block_size`,
`num_gpu_blocks`, `kv_offloading_backend` and `kv_offloading_size` (GiB) as labels. A config.json gives the
shape: layers × KV heads × head dim × 2 (K and V) × bytes per value, divided by the tensor-parallel ranks for
one GPU's share. The parameter count says nothing about this, so it is never used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "float8_e4m3fn": 1, "int8": 1}
DISAGREEMENT = 0.02  # relative difference above which the two sources are reported as disagreeing


@dataclass(frozen=True)
class ServerCache:
    """What `vllm:cache_config_info` says (None: not shown by this server)."""

    block_size: int | None
    num_gpu_blocks: int | None
    kv_cache_size_tokens: int | None
    kv_cache_memory_bytes: int | None
    offloading_backend: str | None
    offloading_size_gib: float | None
    cache_dtype: str | None

    @property
    def bytes_per_token(self) -> float | None:
        if self.kv_cache_memory_bytes and self.kv_cache_size_tokens:
            return self.kv_cache_memory_bytes / self.kv_cache_size_tokens
        return None

    @property
    def gpu_tokens(self) -> int | None:
        if self.kv_cache_size_tokens:
            return self.kv_cache_size_tokens
        if self.num_gpu_blocks and self.block_size:
            return self.num_gpu_blocks * self.block_size
        return None


@dataclass(frozen=True)
class ModelShape:
    layers: int
    kv_heads: int
    head_dim: int
    dtype: str
    tensor_parallel: int

    @property
    def bytes_per_token_all_ranks(self) -> int:
        return self.layers * self.kv_heads * self.head_dim * 2 * DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> float:
        """One rank's share, comparable with a server's own `kv_cache_memory_bytes / kv_cache_size_tokens`."""
        return self.bytes_per_token_all_ranks / self.tensor_parallel


class ConfigError(ValueError):
    pass


def server_cache_from_metrics(text: str) -> ServerCache | None:
    """The cache figures of a Prometheus exposition; None when it has no `vllm:cache_config_info`."""
    for family in text_string_to_metric_families(text):
        if family.name == "vllm:cache_config_info" and family.samples:
            return _server_cache(dict(family.samples[0].labels))
    return None


def _server_cache(labels: dict[str, str]) -> ServerCache:
    return ServerCache(
        block_size=_int(labels.get("block_size")),
        num_gpu_blocks=_int(labels.get("num_gpu_blocks")),
        kv_cache_size_tokens=_int(labels.get("kv_cache_size_tokens")),
        kv_cache_memory_bytes=_int(labels.get("kv_cache_memory_bytes")),
        offloading_backend=_text(labels.get("kv_offloading_backend")),
        offloading_size_gib=_float(labels.get("kv_offloading_size")),
        cache_dtype=_text(labels.get("cache_dtype")),
    )


def prefill_seconds_per_token(text: str) -> float | None:
    """Mean prefill time per computed prompt token, from vLLM's own histogram and token counters (None if absent)."""
    prefill_sum = computed = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:request_prefill_time_seconds_sum":
                prefill_sum += sample.value
            elif sample.name == "vllm:prompt_tokens_by_source_total" and \
                    sample.labels.get("source") == "local_compute":
                computed += sample.value
    return prefill_sum / computed if prefill_sum > 0 and computed > 0 else None


def model_shape(path: Path, tensor_parallel: int, kv_dtype: str | None) -> ModelShape:
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ConfigError(f"{path}: cannot read: {error}") from error
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: not a JSON object")
    config = config.get("text_config", config) if isinstance(config.get("text_config"), dict) else config
    return _shape(path, config, tensor_parallel, kv_dtype)


def _shape(path: Path, config: dict[str, Any], tensor_parallel: int, kv_dtype: str | None) -> ModelShape:
    layers = _int(config.get("num_hidden_layers"))
    heads = _int(config.get("num_attention_heads"))
    kv_heads = _int(config.get("num_key_value_heads")) or heads
    hidden = _int(config.get("hidden_size"))
    head_dim = _int(config.get("head_dim")) or (hidden // heads if hidden and heads else None)
    dtype = kv_dtype if kv_dtype not in (None, "auto") else str(config.get("torch_dtype") or config.get("dtype") or "")
    missing = [name for name, value in (("num_hidden_layers", layers), ("num_key_value_heads", kv_heads),
                                         ("head_dim", head_dim)) if not value]
    if missing:
        raise ConfigError(f"{path}: cannot tell {', '.join(missing)}")
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"{path}: unknown dtype {dtype!r}; pass --kv-cache-dtype")
    assert layers and kv_heads and head_dim
    return ModelShape(layers, kv_heads, head_dim, dtype, tensor_parallel)


def compare(server: float | None, model: float | None) -> str | None:
    """A sentence when the server's figure and the model shape disagree by more than DISAGREEMENT."""
    if server is None or model is None:
        return None
    difference = abs(server - model) / model
    if difference <= DISAGREEMENT:
        return None
    return (f"the server reports {server:,.0f} KV bytes per token but the model shape gives {model:,.0f} "
            f"({difference:.0%} apart): check the KV cache dtype, the tensor-parallel size, or whether the server "
            "pads its pages; the server's own figure is used")


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(float(value))
        except ValueError:
            return None
    return None


def _float(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _text(value: str | None) -> str | None:
    return None if value in (None, "None", "") else value
