"""`kvgate plan`: read the reuse trace (SQLite at KVGATE_STATE_PATH, or Redis at KVGATE_REDIS_URL) and the
upstream's cache figures, and print the plan. Works whether or not a gateway is running."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from pathlib import Path
from typing import Any

import httpx

from gateway.connectors.cache_server import cache_server_memory
from gateway.isotime import parse_since
from gateway.plan.build import H200_LINK_BYTES_PER_S, PlanInputs, build_plan
from gateway.plan.kvsize import (
    ConfigError,
    ModelShape,
    model_shape,
    prefill_seconds_per_token,
    server_cache_from_metrics,
)
from gateway.plan.render import render
from gateway.plan.workingset import parse_window
from gateway.reuse.record import TraceRecord
from gateway.reuse.store import trace_store_for
from gateway.settings import Settings


class PlanError(Exception):
    pass


def positive_int(text: str) -> int:
    """A count that divides something (ranks, block sizes): 0 or less would divide by zero or mean nothing."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def byte_count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of bytes") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must not be negative")
    return value


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("How much RAM should the CPU offload tier get? Replays the gateway's reuse trace through "
                          "a two-tier model of vLLM's caches and recommends cpu_bytes_to_use.")
    parser.add_argument("--since", type=parse_since, help="ISO time: only requests from then on")
    parser.add_argument("--tenant", help="only this tenant's requests (default: all, as the server sees them)")
    parser.add_argument("--pool", help="the pool to plan (default: the one with most requests)")
    parser.add_argument("--window", default="10m,1h,24h", help="reuse windows for the working set (default 10m,1h,24h)")
    parser.add_argument("--format", choices=("table", "json", "md"), default="table")
    parser.add_argument("--plot", type=Path, metavar="PNG", help="draw the predicted hit-rate curve (needs matplotlib)")
    source = parser.add_argument_group("the server's shape")
    source.add_argument("--metrics", metavar="URL|FILE", help="the upstream vLLM's /metrics (URL or saved text)")
    source.add_argument("--model-config", type=Path, metavar="config.json", help="the model's config.json")
    source.add_argument("--tensor-parallel", type=positive_int, default=1, help="tensor-parallel ranks (default 1)")
    source.add_argument("--kv-cache-dtype", help="KV cache dtype if not the model's (e.g. fp8)")
    source.add_argument("--gpu-kv-tokens", type=positive_int,
                        help="GPU KV cache size in tokens (default: from --metrics)")
    source.add_argument("--block-size", type=positive_int, help="GPU block size (default: from --metrics)")
    source.add_argument("--offload-block-tokens", type=positive_int, default=64,
                        help="the tier's block size (default 64)")
    source.add_argument("--server-ignores-max-load", action="store_true",
                        help="the server ignores kv_transfer_params.max_load_tokens (vLLM 0.25; see kvgate doctor)")
    budget = parser.add_argument_group("host budgets (unknown unless given)")
    budget.add_argument("--host-ram", type=byte_count, metavar="BYTES", help="RAM of the host running vLLM")
    budget.add_argument("--weights-bytes", type=byte_count, metavar="BYTES", help="model weights held in host RAM")
    budget.add_argument("--headroom", type=byte_count, metavar="BYTES", help="RAM kept for the OS, tokenizers, buffers")
    budget.add_argument("--cache-process-rss", type=byte_count, metavar="BYTES",
                        help="resident size of a separate cache process (e.g. LMCache in multi-process mode)")
    budget.add_argument("--cache-server-metrics", metavar="URL|FILE",
                        help="an LMCache multi-process server's /metrics: its process_resident_memory_bytes becomes "
                             "the cache process's budget line (unless --cache-process-rss is given)")
    budget.add_argument("--current-cpu-bytes", type=byte_count, metavar="BYTES", help="the tier's size today, if any")
    budget.add_argument("--cpu-bytes", type=byte_count, action="append", default=[], metavar="BYTES",
                        help="also predict for this tier size (repeatable)")
    speed = parser.add_argument_group("transfer and prefill speed")
    speed.add_argument("--link-gbps", type=positive_number, default=H200_LINK_BYTES_PER_S / 1e9,
                       help="CPU→GPU load bandwidth in GB/s (default 39, measured on the H200)")
    speed.add_argument("--prefill-tokens-per-s", type=positive_number,
                       help="prefill speed (default: from the server's metrics, else unknown)")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    try:
        plan = asyncio.run(plan_from_args(args, Settings()))
    except (PlanError, ConfigError, ValueError, OSError, httpx.HTTPError) as error:
        print(f"kvgate plan: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(json.dumps(plan, indent=2) + "\n" if args.format == "json" else render(plan, args.format))
    if args.plot is not None:
        from gateway.plan.plot import draw_curve

        draw_curve(plan, args.plot)
    return 0


async def plan_from_args(args: argparse.Namespace, settings: Settings) -> dict[str, Any]:
    windows = [parse_window(part) for part in args.window.split(",") if part.strip()]
    metrics_text = await _metrics_text(args.metrics) if args.metrics else None
    server = server_cache_from_metrics(metrics_text) if metrics_text else None
    if metrics_text is not None and server is None:
        raise PlanError(f"{args.metrics}: no vllm:cache_config_info in it")
    shape: ModelShape | None = None
    if args.model_config is not None:
        shape = model_shape(args.model_config, args.tensor_parallel, args.kv_cache_dtype)
    prefill = 1.0 / args.prefill_tokens_per_s if args.prefill_tokens_per_s else (
        prefill_seconds_per_token(metrics_text) if metrics_text else None)
    since = args.since.timestamp() if args.since else None
    if not settings.redis_url and not settings.state_path.exists():
        raise PlanError(f"no trace store at {settings.state_path} (set KVGATE_STATE_PATH, or KVGATE_REDIS_URL, as "
                        "the gateway has them)")
    records = await read_trace(settings, args.tenant, since)
    cache_rss = args.cache_process_rss
    if cache_rss is None and args.cache_server_metrics:
        cache_rss = await _cache_server_rss(args.cache_server_metrics)
    inputs = PlanInputs(windows_s=windows, server=server, model=shape, prefill_s_per_token=prefill,
                        host_ram_bytes=args.host_ram, weights_bytes=args.weights_bytes, headroom_bytes=args.headroom,
                        cache_process_rss_bytes=cache_rss, current_cpu_bytes=args.current_cpu_bytes,
                        evaluate_cpu_bytes=args.cpu_bytes, gpu_kv_tokens=args.gpu_kv_tokens,
                        block_size=args.block_size, offload_block_tokens=args.offload_block_tokens,
                        tensor_parallel=args.tensor_parallel, link_bytes_per_s=args.link_gbps * 1e9, pool=args.pool,
                        tenant=args.tenant, since=since, honour_max_load=not args.server_ignores_max_load)
    return build_plan(records, inputs)


async def _cache_server_rss(source: str) -> int:
    memory = cache_server_memory(await _metrics_text(source))
    if memory is None:
        raise PlanError(f"{source}: neither process_resident_memory_bytes nor lmcache:local_cache_usage in it")
    if memory.lower_bound:
        print(f"note: {source} shows only the CPU tier's bytes ({memory.metric}); the cache process holds more",
              file=sys.stderr)
    return memory.bytes


async def read_trace(settings: Settings, tenant: str | None, since: float | None) -> list[TraceRecord]:
    async with trace_store_for(settings.redis_url, settings.state_path) as store:
        return await store.read(tenant, since)


async def _metrics_text(source: str) -> str:
    if source.startswith(("http://", "https://")):
        async with httpx.AsyncClient(timeout=10.0) as http:
            response = await http.get(source)
            response.raise_for_status()
            return response.text
    return await asyncio.to_thread(Path(source).read_text)
