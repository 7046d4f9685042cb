"""`kvgate sim`: run one simulated vLLM server until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

from gateway.sim.app import create_sim_app
from gateway.sim.config import SimConfig

GRACEFUL_SHUTDOWN_S = 2


def _byte_count(text: str) -> int:
    return int(float(text))


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--host", default=SimConfig.host, help="address to listen on (default %(default)s)")
    group.add_argument("--port", type=int, default=SimConfig.port, help="port (default %(default)s)")
    group.add_argument("--model", default=SimConfig.model, help="served model name (default %(default)s)")
    group.add_argument("--api-key", dest="api_keys", action="append", default=None,
                       help="vLLM API key (repeatable; guards only /v1, /v2, /inference, /cohere paths); "
                            "default: the VLLM_API_KEY environment variable, else none")
    group.add_argument("--seed", type=int, default=SimConfig.seed, help="seed of random generation")
    group.add_argument("--vllm-version", default=SimConfig.vllm_version,
                       help="version GET /version reports (default %(default)s)")
    group.add_argument("--max-model-len", type=int, default=SimConfig.max_model_len)
    group.add_argument("--max-tokens-default", type=int, default=SimConfig.max_tokens_default,
                       help="max_tokens when a request sets none (default %(default)s)")
    group.add_argument("--enable-request-id-headers", action="store_true",
                       help="echo X-Request-Id on responses, as vLLM's flag of that name")
    group.add_argument("--record-limit", type=int, default=SimConfig.record_limit,
                       help="requests kept for GET /sim/requests (default %(default)s)")
    group.add_argument("--access-log", action="store_true", help="log one line per HTTP request")
    group.add_argument("--server-dev-mode", action="store_true",
                       help="serve GET /server_info as vLLM does with VLLM_SERVER_DEV_MODE=1 (config as JSON)")
    group.add_argument("--corrupt-output", action="store_true",
                       help="deliberately wrong arm: deterministic requests get different text")


def _cache_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KV cache and timing model")
    group.add_argument("--block-size", type=int, default=SimConfig.block_size, help="tokens per GPU block")
    group.add_argument("--gpu-blocks", type=int, default=SimConfig.gpu_blocks, help="GPU KV blocks")
    group.add_argument("--base-ttft-ms", type=float, default=SimConfig.base_ttft_ms,
                       help="fixed cost of a prefill step (default %(default)s)")
    group.add_argument("--prefill-us-per-token", type=float, default=SimConfig.prefill_us_per_token,
                       help="cost of an uncached prompt token (default %(default)s)")
    group.add_argument("--cached-us-per-token", type=float, default=SimConfig.cached_us_per_token,
                       help="cost of a GPU-cached prompt token (default %(default)s)")
    group.add_argument("--decode-ms-per-token", type=float, default=SimConfig.decode_ms_per_token,
                       help="time between generated tokens (default %(default)s)")


def _offload_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("CPU offload tier (OffloadingConnector)")
    group.add_argument("--offload", action="store_true", help="enable the CPU tier")
    group.add_argument("--cpu-bytes-to-use", type=_byte_count, default=SimConfig.cpu_bytes_to_use,
                       help="CPU tier size in bytes (default %(default)s)")
    group.add_argument("--offload-block-size", type=int, default=SimConfig.offload_block_size,
                       help="tokens per offloaded chunk, a multiple of --block-size (default %(default)s)")
    group.add_argument("--kv-bytes-per-token", type=int, default=SimConfig.kv_bytes_per_token,
                       help="KV bytes per token of the simulated model (default: Qwen3-8B, %(default)s)")
    group.add_argument("--load-us-per-token", type=float, default=SimConfig.load_us_per_token,
                       help="cost of a token loaded from (or stored to) the CPU tier (default %(default)s)")
    group.add_argument("--ignore-max-load-tokens", action="store_true",
                       help="load the whole CPU hit whatever max_load_tokens says, as vLLM 0.25.0 does")
    group.add_argument("--fail-loads", type=float, default=SimConfig.fail_loads, metavar="RATE",
                       help="share of CPU-tier loads that fail, 0..1 (default %(default)s; [[sim:fail-load]] "
                            "fails one request's load)")
    group.add_argument("--load-failure-policy", choices=("fail", "recompute"),
                       default=SimConfig.load_failure_policy,
                       help="vLLM's kv_load_failure_policy: fail = the request errors before its first token; "
                            "recompute = the failed tokens are prefilled instead (default %(default)s)")


def _lmcache_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LMCache in-process mode (LMCacheConnectorV1); see docs/lmcache.md")
    group.add_argument("--lmcache", action="store_true", help="an LMCache tier instead of --offload")
    group.add_argument("--lmcache-chunk-size", type=int, default=SimConfig.lmcache_chunk_size,
                       help="tokens per LMCache chunk (default %(default)s)")
    group.add_argument("--lmcache-chunks", type=int, default=SimConfig.lmcache_chunks,
                       help="chunks the tier holds before evicting silently (default %(default)s)")
    group.add_argument("--lmcache-ignore-salt", action="store_true",
                       help="leave cache_salt out of the cache identity, like the versions with that defect")
    group.add_argument("--lmcache-medium", default=SimConfig.lmcache_medium,
                       help="medium name on LMCache's KV events: cpu, disk, remote, ... (default %(default)s)")


def _event_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("KV events (ZMQ)")
    group.add_argument("--kv-events-endpoint", default=None,
                       help="PUB endpoint, e.g. tcp://*:5557 (bind when it has '*', else connect)")
    group.add_argument("--kv-events-replay-endpoint", default=None, help="ROUTER replay endpoint (binds)")
    group.add_argument("--kv-events-topic", default=SimConfig.kv_events_topic, help="topic frame")
    group.add_argument("--kv-events-buffer-steps", type=int, default=SimConfig.kv_events_buffer_steps,
                       help="batches kept for replay (default %(default)s)")
    group.add_argument("--kv-events-hwm", type=int, default=SimConfig.kv_events_hwm,
                       help="PUB high-water mark in messages, as vLLM's `hwm` (default %(default)s)")
    group.add_argument("--self-describing-kv-events", action="store_true",
                       help="full CPU BlockStored payloads instead of placeholders")
    group.add_argument("--replay-without-topic", action="store_true",
                       help="replay replies without the topic frame, as vLLM 0.25.0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register the `kvgate sim` flags on `parser`."""
    for register in (_server_arguments, _cache_arguments, _offload_arguments, _lmcache_arguments,
                     _event_arguments):
        register(parser)


def build_config(args: argparse.Namespace) -> SimConfig:
    if args.api_keys is None and os.environ.get("VLLM_API_KEY"):
        args.api_keys = [os.environ["VLLM_API_KEY"]]
    return SimConfig.from_namespace(args)


def _absorb(signum: int, frame: FrameType | None) -> None:
    """Handler left in place while uvicorn runs, so its re-raise of the stop signal ends nothing."""


@contextmanager
def _clean_exit_on_signals() -> Iterator[None]:
    """uvicorn re-raises SIGTERM/SIGINT after a graceful stop; absorb that so the exit status is 0."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    handled = (signal.SIGINT, signal.SIGTERM)
    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {
        sig: signal.signal(sig, _absorb) for sig in handled
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT; 0 after a clean shutdown, 2 for invalid flags, 1 if startup failed."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = build_config(args)
    except ValueError as exc:
        logging.getLogger("gateway.sim").error("invalid simulator settings: %s", exc)
        return 2
    server = uvicorn.Server(uvicorn.Config(
        create_sim_app(config), host=config.host, port=config.port, lifespan="on", access_log=config.access_log,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S, log_level="info",
    ))
    try:
        with _clean_exit_on_signals():
            server.run()
    except SystemExit as exc:
        logging.getLogger("gateway.sim").error("simulator failed to start (%s)", exc.code)
        return 1
    return 0 if server.started else 1
