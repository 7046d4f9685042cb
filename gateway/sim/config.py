"""Settings of one simulated vLLM server, built from command-line arguments."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Any

QWEN3_8B_KV_BYTES_PER_TOKEN = 147456
"""36 layers x 2 (K and V) x 8 KV heads x 128 head_dim x 2 bytes (bf16): the captured model's shape."""


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes one simulator instance; immutable once built."""

    host: str = "127.0.0.1"
    port: int = 8000
    model: str = "sim-model"
    block_size: int = 16
    gpu_blocks: int = 2048
    max_model_len: int = 16384
    api_keys: tuple[str, ...] = ()
    seed: int = 0
    base_ttft_ms: float = 5.0
    prefill_us_per_token: float = 40.0
    cached_us_per_token: float = 1.0
    decode_ms_per_token: float = 2.0
    max_tokens_default: int = 16
    offload: bool = False
    cpu_bytes_to_use: int = 12_000_000_000
    offload_block_size: int = 64
    kv_bytes_per_token: int = QWEN3_8B_KV_BYTES_PER_TOKEN
    load_us_per_token: float = 4.0
    vllm_version: str = "0.25.0"  # what GET /version and system_fingerprint report
    ignore_max_load_tokens: bool = False  # as vLLM 0.25.0's offloading scheduler, which never reads it
    fail_loads: float = 0.0  # share of CPU-tier loads that fail (seeded by --seed)
    load_failure_policy: str = "fail"  # vLLM's kv_load_failure_policy: fail | recompute
    server_dev_mode: bool = False  # VLLM_SERVER_DEV_MODE=1: GET /server_info shows the engine config
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None
    kv_events_topic: str = ""
    kv_events_buffer_steps: int = 10000
    kv_events_hwm: int = 100_000  # vLLM's KVEventsConfig.hwm: PUB high-water mark, in messages
    self_describing_kv_events: bool = False
    lmcache: bool = False
    lmcache_chunk_size: int = 256
    lmcache_chunks: int = 4096
    lmcache_ignore_salt: bool = False
    lmcache_medium: str = "cpu"
    replay_without_topic: bool = False
    corrupt_output: bool = False
    enable_request_id_headers: bool = False
    record_limit: int = 1000
    access_log: bool = False

    def __post_init__(self) -> None:
        for problem in self.problems():
            raise ValueError(problem)

    def problems(self) -> list[str]:
        """Human-readable reasons this configuration cannot run (empty when valid)."""
        found = [f"{name} must be positive" for name in _POSITIVE if getattr(self, name) <= 0]
        if self.block_size > 0 and self.offload_block_size % self.block_size:
            found.append("offload_block_size must be a multiple of block_size")
        if self.offload and self.lmcache:
            found.append("--offload and --lmcache are two KV connectors; a server has one")
        found += [f"{name} must not be negative" for name in _NON_NEGATIVE if getattr(self, name) < 0]
        if not 0.0 <= self.fail_loads <= 1.0:
            found.append("fail_loads must be between 0 and 1")
        if self.load_failure_policy not in ("fail", "recompute"):
            found.append("load_failure_policy must be fail or recompute")
        return found

    @property
    def blocks_per_chunk(self) -> int:
        return self.offload_block_size // self.block_size

    @property
    def cpu_chunks(self) -> int:
        """Capacity of the CPU tier in chunks of `offload_block_size` tokens (0 without --offload)."""
        if not self.offload:
            return 0
        return self.cpu_bytes_to_use // (self.offload_block_size * self.kv_bytes_per_token)

    @property
    def events_enabled(self) -> bool:
        return self.kv_events_endpoint is not None

    @classmethod
    def from_namespace(cls, args: argparse.Namespace) -> SimConfig:
        """Build from parsed `kvgate sim` arguments; attributes the namespace lacks keep defaults."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {k: v for k, v in vars(args).items() if k in names and v is not None}
        if "api_keys" in values:
            values["api_keys"] = tuple(values["api_keys"])
        return cls(**values)


_POSITIVE = ("port", "block_size", "gpu_blocks", "max_model_len", "max_tokens_default", "offload_block_size",
             "kv_bytes_per_token", "kv_events_buffer_steps", "kv_events_hwm", "record_limit", "lmcache_chunk_size",
             "lmcache_chunks")
_NON_NEGATIVE = ("base_ttft_ms", "prefill_us_per_token", "cached_us_per_token", "decode_ms_per_token",
                 "load_us_per_token", "cpu_bytes_to_use")
