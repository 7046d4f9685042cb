"""Assemble the plan: KV size, budgets, working sets, the predicted hit-rate curve, and a recommendation.

Every figure that cannot be read is None in the plan (rendered "unknown"), never 0.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.plan.admission_effect import admission_effect
from gateway.plan.kvsize import ModelShape, ServerCache, compare
from gateway.plan.replay import CacheShape, RequestReplay, TierShares, replay, share_error_bound, shares_at
from gateway.plan.workingset import working_set
from gateway.reuse.record import TraceRecord
from gateway.reuse.sampling import root_value, threshold_for_rate

H200_LINK_BYTES_PER_S = 39e9  # vLLM 0.25 loading a 1.18 GB prefix from the CPU tier on the H200 (28.5 ms)
KNEE_SHARE = 0.95  # the knee: the smallest tier that serves this share of what an unbounded tier would
CURVE_POINTS = 16
ONE_OFF_WARNING = 0.5
NOT_WORTH = 0.02  # an unbounded tier serving less than this share of prompt tokens does not pay
MAX_REPLAY_CHUNKS = 3_000_000  # fingerprints replayed at most; beyond, the plan samples further (SHARDS)


@dataclass(frozen=True)
class PlanInputs:
    windows_s: Sequence[float] = (600.0, 3600.0, 86400.0)
    server: ServerCache | None = None
    model: ModelShape | None = None
    prefill_s_per_token: float | None = None  # from the server's metrics, or 1 / --prefill-tokens-per-s
    host_ram_bytes: int | None = None
    weights_bytes: int | None = None  # weights held in host RAM (0 when only on the GPU)
    headroom_bytes: int | None = None
    cache_process_rss_bytes: int | None = None
    current_cpu_bytes: int | None = None
    evaluate_cpu_bytes: Sequence[int] = ()
    gpu_kv_tokens: int | None = None  # override of the server's figure
    block_size: int | None = None  # override of the server's figure
    offload_block_tokens: int = 64
    tensor_parallel: int = 1
    link_bytes_per_s: float = H200_LINK_BYTES_PER_S
    honour_max_load: bool = True  # False for servers that ignore kv_transfer_params.max_load_tokens (vLLM 0.25)
    pool: str | None = None
    tenant: str | None = None
    since: float | None = None


@dataclass
class Notes:
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Prediction:
    """What every point of the curve is computed from: the sample replayed through the cache model, the
    sampling rate that scales it back to the whole trace, the inputs and the KV section of the plan."""

    replayed: Sequence[RequestReplay]
    sample: Sequence[TraceRecord]
    rate: float
    inputs: PlanInputs
    kv: dict[str, Any]

    @property
    def chunk_tokens(self) -> int:
        return self.inputs.offload_block_tokens

    @property
    def chunk_bytes(self) -> float | None:
        """One offload chunk across all ranks; None while the KV bytes per token are unknown."""
        bytes_per_token = self.kv["bytes_per_token_all_ranks"]
        return self.chunk_tokens * bytes_per_token if bytes_per_token is not None else None


def build_plan(records: Sequence[TraceRecord], inputs: PlanInputs) -> dict[str, Any]:
    notes = Notes()
    pool = _choose_pool(records, inputs.pool, notes)
    chosen = [r for r in records if r.pool == pool] if pool is not None else []
    rate, sample = _consistent_sample(chosen, notes)
    kv = _kv_section(inputs, notes)
    plan: dict[str, Any] = {
        "generated_at": time.time(), "pool": pool, "tenant": inputs.tenant, "since": inputs.since,
        "trace": _trace_section(sample, rate),
        "kv": kv,
        "working_set": [_window_view(sample, window, rate, kv["bytes_per_token_all_ranks"])
                        for window in inputs.windows_s],
    }
    shape = _cache_shape(inputs, sample, rate, notes)
    if shape is None or not sample:
        if not sample:
            notes.warnings.append("no trace records for this selection: nothing to predict from")
        plan |= {"curve": None, "knee": None, "recommendation": None, "budgets": _budgets(inputs, kv, None, notes)}
    else:
        prediction = Prediction(replay(sample, shape, inputs.honour_max_load), sample, rate, inputs, kv)
        plan |= _predict(prediction, shape, plan["working_set"], notes)
    _warn_one_off(plan, notes)
    plan["warnings"], plan["notes"] = notes.warnings, notes.notes
    return plan


def _choose_pool(records: Sequence[TraceRecord], wanted: str | None, notes: Notes) -> str | None:
    counts = Counter(r.pool for r in records)
    if wanted is not None:
        return wanted
    if not counts:
        return None
    pool = counts.most_common(1)[0][0]
    if len(counts) > 1:
        others = ", ".join(f"{name} ({n})" for name, n in counts.items() if name != pool)
        notes.notes.append(f"planned pool {pool!r} (most requests); the trace also has {others}: use --pool")
    return pool


def _consistent_sample(records: Sequence[TraceRecord], notes: Notes) -> tuple[float, list[TraceRecord]]:
    """Keep the records under the lowest threshold seen (one consistent SHARDS sample), and sample further
    when the trace is too large to replay in reasonable time."""
    if not records:
        return 1.0, []
    rate = min(r.rate for r in records)
    total = sum(r.chunks for r in records)
    if total > MAX_REPLAY_CHUNKS:
        rate = min(rate, rate * MAX_REPLAY_CHUNKS / total)
        notes.notes.append(f"the trace holds {total:,} fingerprints; replayed a {rate:.3g} sample of its prefix roots")
    threshold = threshold_for_rate(rate)
    kept = [r for r in records if r.chain and root_value(r.chain[:8]) < threshold]
    if rate < 1.0:
        notes.notes.append(f"sampled at {rate:.3g} (whole prefix chains, caches scaled alike): each share carries a "
                           "95 % bound from the spread between sampled prefixes; popular prefixes left out of the "
                           "sample can move a share further than that (docs/plan.md)")
    return rate, kept


def _trace_section(sample: Sequence[TraceRecord], rate: float) -> dict[str, Any]:
    span = sample[-1].ts - sample[0].ts if len(sample) > 1 else 0.0
    text = sum(1 for r in sample if r.text)
    return {"records": len(sample), "sample_rate": rate, "span_s": span,
            "first": sample[0].ts if sample else None, "last": sample[-1].ts if sample else None,
            "tenants": sorted({r.tenant for r in sample}), "text_records": text,
            "prompt_tokens": sum(r.prompt_tokens for r in sample) / rate if sample else 0,
            "observed_cached_share": (sum(r.cached_tokens for r in sample) / sum(r.prompt_tokens for r in sample))
            if sample else None}


def _kv_section(inputs: PlanInputs, notes: Notes) -> dict[str, Any]:
    server = inputs.server.bytes_per_token if inputs.server is not None else None
    model = inputs.model.bytes_per_token if inputs.model is not None else None
    disagreement = compare(server, model)
    if disagreement:
        notes.warnings.append(disagreement)
    per_rank = server if server is not None else model
    source = "server /metrics (vllm:cache_config_info)" if server is not None else (
        "model config.json" if model is not None else None)
    if per_rank is None:
        notes.warnings.append("KV bytes per token unknown: give --metrics (the upstream's /metrics) or "
                              "--model-config (its config.json); sizes are shown in tokens only")
    gpu_tokens = inputs.gpu_kv_tokens or (inputs.server.gpu_tokens if inputs.server else None)
    gpu_bytes = inputs.server.kv_cache_memory_bytes if inputs.server is not None else None
    if inputs.gpu_kv_tokens is not None or gpu_bytes is None:  # sized from the tokens given, when overridden
        gpu_bytes = round(gpu_tokens * per_rank) if gpu_tokens is not None and per_rank is not None else None
    return {"bytes_per_token": per_rank, "bytes_per_token_source": source, "server_bytes_per_token": server,
            "model_bytes_per_token": model, "tensor_parallel": inputs.tensor_parallel,
            "bytes_per_token_all_ranks": per_rank * inputs.tensor_parallel if per_rank is not None else None,
            "disagreement": disagreement, "gpu_kv_cache_bytes": gpu_bytes,
            "gpu_kv_cache_tokens": gpu_tokens,
            "block_size": inputs.block_size or (inputs.server.block_size if inputs.server else None),
            "offloading_backend": inputs.server.offloading_backend if inputs.server else None,
            "offloading_size_gib": inputs.server.offloading_size_gib if inputs.server else None}


def _window_view(sample: Sequence[TraceRecord], window_s: float, rate: float,
                 bytes_per_token: float | None) -> dict[str, Any]:
    view = working_set(sample, window_s, rate)
    return {"window_s": window_s, "windows_in_trace": view.windows, "busiest_window_requests": view.requests,
            "prompt_tokens": view.prompt_tokens, "returning_tokens": view.returning_tokens,
            "returning_bytes": _bytes(view.returning_tokens, bytes_per_token), "hot_tokens": view.hot_tokens,
            "hot_bytes": _bytes(view.hot_tokens, bytes_per_token), "one_off_share": view.one_off_share}


def _bytes(tokens: float, bytes_per_token: float | None) -> float | None:
    return tokens * bytes_per_token if bytes_per_token is not None else None


def _cache_shape(inputs: PlanInputs, sample: Sequence[TraceRecord], rate: float, notes: Notes) -> CacheShape | None:
    server = inputs.server
    gpu_tokens = inputs.gpu_kv_tokens or (server.gpu_tokens if server else None)
    block = inputs.block_size or (server.block_size if server else None)
    if gpu_tokens is None or block is None:
        notes.warnings.append("the GPU KV cache size is unknown (no vllm:cache_config_info): give --metrics or "
                              "--gpu-kv-tokens and --block-size; no hit-rate curve without it")
        return None
    trace_blocks = {r.chunk_units for r in sample if not r.text}
    if trace_blocks and trace_blocks != {block}:
        notes.warnings.append(f"the trace cut token-id prompts every {sorted(trace_blocks)} tokens but the server's "
                              f"block is {block}: GPU hits are approximate (set KVGATE_REUSE_BLOCK_TOKENS={block})")
    if any(r.text for r in sample):
        notes.notes.append("text and chat prompts were fingerprinted by characters (about one block each), so "
                           "their block boundaries are approximate")
    return CacheShape(gpu_blocks=gpu_tokens / block * rate, block_size=block,
                      offload_block_tokens=inputs.offload_block_tokens)


def _predict(prediction: Prediction, shape: CacheShape, working_sets: Sequence[dict[str, Any]],
             notes: Notes) -> dict[str, Any]:
    sample, rate, inputs, replayed = prediction.sample, prediction.rate, prediction.inputs, prediction.replayed
    _note_caps(sample, inputs, notes)
    distinct_chunks = _distinct_chunk_tokens(sample, shape) / prediction.chunk_tokens  # in sampled chunks
    top = max(1, math.ceil(distinct_chunks * 1.05))
    unbounded = shares_at(replayed, top)
    knee_chunks = _knee_chunks(replayed, top, unbounded.cpu_share)
    chunk_bytes = prediction.chunk_bytes
    steps = sorted({round(top * i / CURVE_POINTS) for i in range(CURVE_POINTS + 1)} | {knee_chunks})
    curve = [_point(prediction, n, "knee" if n == knee_chunks else None) for n in steps]
    evaluated = [_point(prediction, _chunks_for_bytes(b, chunk_bytes, rate), f"{b} bytes")
                 for b in inputs.evaluate_cpu_bytes] if chunk_bytes is not None else []
    if inputs.evaluate_cpu_bytes and chunk_bytes is None:
        notes.warnings.append("--cpu-bytes needs the KV bytes per token; not evaluated")
    knee = _point(prediction, knee_chunks, "knee")
    budgets = _budgets(inputs, prediction.kv, knee, notes)
    recommendation = _recommend(prediction, knee, unbounded.cpu_share, budgets, working_sets, notes)
    return {"curve": curve, "evaluated": evaluated, "knee": knee, "budgets": budgets,
            "recommendation": recommendation,
            "admission": admission_effect(sample, shape, knee_chunks, inputs.honour_max_load),
            "unbounded_cpu_share": unbounded.cpu_share, "gpu_only_share": shares_at(replayed, 0).gpu_share}


def _note_caps(sample: Sequence[TraceRecord], inputs: PlanInputs, notes: Notes) -> None:
    capped = sum(1 for r in sample if r.max_offload_tokens is not None)
    loads = sum(1 for r in sample if r.max_load_tokens is not None)
    if capped:
        notes.notes.append(f"{capped / len(sample):.0%} of requests limited what the tier stores "
                           "(max_offload_tokens, from policy caps or offload admission); modelled")
    if loads:
        how = "modelled" if inputs.honour_max_load else "ignored, as this server does (--server-ignores-max-load)"
        notes.notes.append(f"{loads / len(sample):.0%} of requests carried max_load_tokens; {how}")


def _distinct_chunk_tokens(sample: Sequence[TraceRecord], shape: CacheShape) -> float:
    seen: set[bytes] = set()
    for record in sample:
        per_chunk = max(1, round(shape.offload_block_tokens / record.tokens_per_chunk))
        chain = record.fingerprint_list()
        seen.update(chain[(i + 1) * per_chunk - 1] for i in range(len(chain) // per_chunk))
    return len(seen) * float(shape.offload_block_tokens)


def _knee_chunks(replayed: Sequence[RequestReplay], top: int, best: float) -> int:
    """Smallest tier (in sampled chunks) that serves KNEE_SHARE of what an unbounded tier serves."""
    if best <= 0:
        return 0
    low, high = 0, top
    while low < high:
        middle = (low + high) // 2
        if shares_at(replayed, middle).cpu_share >= KNEE_SHARE * best - 1e-12:
            high = middle
        else:
            low = middle + 1
    return low


def _chunks_for_bytes(cpu_bytes: int, chunk_bytes: float | None, rate: float) -> int:
    """The tier's capacity in chunks, as the OffloadingConnector computes it, scaled to the sample."""
    if chunk_bytes is None:
        return 0
    return int((cpu_bytes // chunk_bytes) * rate)


def _point(prediction: Prediction, chunks_sampled: int, label: str | None) -> dict[str, Any]:
    """The tier of `chunks_sampled` chunks (in the sample's scale): what it serves, loads and saves."""
    sample, rate, inputs = prediction.sample, prediction.rate, prediction.inputs
    chunk_tokens, chunk_bytes = prediction.chunk_tokens, prediction.chunk_bytes
    shares: TierShares = shares_at(prediction.replayed, chunks_sampled)
    gpu_error, cpu_error = share_error_bound(shares, rate)
    full_chunks = chunks_sampled / rate
    span = sample[-1].ts - sample[0].ts if len(sample) > 1 else 0.0
    cpu_tokens = shares.cpu_tokens / rate
    per_hour = cpu_tokens * 3600 / span if span >= 1.0 else None
    bpt_all = chunk_bytes / chunk_tokens if chunk_bytes is not None else None
    load_bytes_hour = per_hour * bpt_all if per_hour is not None and bpt_all is not None else None
    load_s_hour = load_bytes_hour / inputs.link_bytes_per_s if load_bytes_hour is not None else None
    saving = _ttft_saving(shares, rate, len(sample), inputs, bpt_all)
    return {"label": label, "cpu_tokens": full_chunks * chunk_tokens,
            "cpu_bytes": full_chunks * chunk_bytes if chunk_bytes is not None else None,
            "gpu_share": shares.gpu_share, "cpu_share": shares.cpu_share,
            "recomputed_share": 1.0 - shares.gpu_share - shares.cpu_share,
            "error_bound": {"gpu_share": gpu_error, "cpu_share": cpu_error, "sampled": rate < 1.0},
            "cpu_to_gpu_tokens_per_hour": per_hour, "cpu_to_gpu_bytes_per_hour": load_bytes_hour,
            "load_seconds_per_hour": load_s_hour, "ttft_saving_ms_per_request": saving}


def _ttft_saving(shares: TierShares, rate: float, requests: int, inputs: PlanInputs,
                 bytes_per_token: float | None) -> float | None:
    """Prefill time of the CPU-served tokens minus their load time, per request (None when either is unknown)."""
    if inputs.prefill_s_per_token is None or bytes_per_token is None or not requests:
        return None
    per_token = inputs.prefill_s_per_token - bytes_per_token / inputs.link_bytes_per_s
    return shares.cpu_tokens * per_token / requests * 1000.0


def _budgets(inputs: PlanInputs, kv: dict[str, Any], knee: dict[str, Any] | None, notes: Notes) -> dict[str, Any]:
    unknown = [name for name, value in (("host_ram", inputs.host_ram_bytes), ("weights_in_host_ram",
               inputs.weights_bytes), ("headroom", inputs.headroom_bytes),
               ("cache_process_rss", inputs.cache_process_rss_bytes)) if value is None]
    limit = None
    if inputs.host_ram_bytes is not None:
        limit = inputs.host_ram_bytes - sum(v or 0 for v in (inputs.weights_bytes, inputs.headroom_bytes,
                                                              inputs.cache_process_rss_bytes))
        ignored = [name for name in unknown if name != "host_ram"]
        if ignored:
            notes.warnings.append(f"the RAM left for the tier does not subtract {', '.join(ignored)} (unknown): "
                                  "give --weights-bytes, --headroom and --cache-process-rss")
    return {"host_ram_bytes": inputs.host_ram_bytes, "weights_in_host_ram_bytes": inputs.weights_bytes,
            "active_requests_gpu_bytes": kv["gpu_kv_cache_bytes"], "headroom_bytes": inputs.headroom_bytes,
            "cache_process_rss_bytes": inputs.cache_process_rss_bytes,
            "reusable_blocks_bytes": knee["cpu_bytes"] if knee is not None else None,
            "left_for_tier_bytes": limit, "unknown": unknown}


def _recommend(prediction: Prediction, knee: dict[str, Any], best: float, budgets: dict[str, Any],
               working_sets: Sequence[dict[str, Any]], notes: Notes) -> dict[str, Any]:
    reasons: list[str] = []
    inputs, kv, rate, chunk_bytes = prediction.inputs, prediction.kv, prediction.rate, prediction.chunk_bytes
    gpu_tokens: int | None = kv["gpu_kv_cache_tokens"]
    bpt_all = kv["bytes_per_token_all_ranks"]
    if best < NOT_WORTH:
        notes.warnings.append(f"an unbounded CPU tier would serve only {best:.1%} of prompt tokens on this traffic: "
                              "offload will not pay")
    _warn_current(inputs, kv, notes)
    if chunk_bytes is None or bpt_all is None:
        return {"cpu_bytes_to_use": None, "reasons": ["the KV bytes per token are unknown, so no byte size can be "
                                                      "given; the knee is at "
                                                      f"{knee['cpu_tokens']:,.0f} tokens"], "point": knee}
    size = float(knee["cpu_bytes"])
    reasons.append(f"the tier serves {knee['cpu_share']:.1%} of prompt tokens at {_gb(size)} — {KNEE_SHARE:.0%} of "
                   f"the {best:.1%} an unbounded tier would; more RAM buys little")
    returning = max((w["returning_bytes"] or 0.0 for w in working_sets), default=0.0)
    if returning and size > 1.5 * returning:
        reasons.append(f"that is {size / returning:.1f}x the prefixes that actually return ({_gb(returning)}): "
                       "blocks that never come back pass through the same LRU tier and push the useful ones out; "
                       "offload admission (offload.admission.mode: returning) keeps one-off prompts out of the "
                       "tier and would shrink the size needed")
    current = _current_tier(inputs, kv)
    if current is not None:
        today = _point(prediction, _chunks_for_bytes(current, chunk_bytes, rate), "current")
        reasons.append(f"today's tier of {_gb(current)} serves {today['cpu_share']:.1%}")
    gpu_bytes = gpu_tokens * bpt_all if gpu_tokens is not None else None
    if gpu_bytes is not None and size < gpu_bytes:
        reasons.append(f"raised to the GPU KV cache ({_gb(gpu_bytes)}): a CPU-only tier smaller than the GPU cache "
                       "mostly holds copies of blocks the GPU already has")
        size = gpu_bytes
    limit = budgets["left_for_tier_bytes"]
    if limit is not None and size > limit:
        notes.warnings.append(f"the recommended tier ({_gb(size)}) is more than the RAM left for it ({_gb(limit)}); "
                              "capped there")
        reasons.append(f"capped at the RAM the budgets leave ({_gb(limit)})")
        size = math.floor(max(0.0, limit) / chunk_bytes) * chunk_bytes  # whole chunks, within the limit
    else:
        if limit is None:
            reasons.append("not checked against host RAM (unknown: give --host-ram)")
        size = math.ceil(size / chunk_bytes) * chunk_bytes  # whole chunks: what the connector allocates
    point = _point(prediction, _chunks_for_bytes(int(size), chunk_bytes, rate), "recommended")
    return {"cpu_bytes_to_use": int(size), "kv_offloading_size_gib": size / 2**30, "reasons": reasons,
            "point": point}


def _current_tier(inputs: PlanInputs, kv: dict[str, Any]) -> int | None:
    if inputs.current_cpu_bytes is not None:
        return inputs.current_cpu_bytes
    return int(kv["offloading_size_gib"] * 2**30) if kv["offloading_size_gib"] is not None else None


def _warn_current(inputs: PlanInputs, kv: dict[str, Any], notes: Notes) -> None:
    current = _current_tier(inputs, kv)
    gpu = kv["gpu_kv_cache_bytes"]
    if current is not None and gpu is not None and current < gpu:
        notes.warnings.append(f"the CPU tier in use ({_gb(current)}) is smaller than the GPU KV cache ({_gb(gpu)}): "
                              "it mostly duplicates what the GPU already holds")


def _warn_one_off(plan: dict[str, Any], notes: Notes) -> None:
    windows = plan["working_set"]
    shares = [w["one_off_share"] for w in windows if w["one_off_share"] is not None]
    if shares and max(shares) > ONE_OFF_WARNING:
        notes.warnings.append(f"mostly one-off traffic: {max(shares):.0%} of prompt tokens never return within a "
                              "window; storing them only evicts blocks that do")
    limit = plan["budgets"]["host_ram_bytes"] if plan.get("budgets") else None
    largest = max((w["returning_bytes"] or 0.0 for w in windows), default=0.0)
    if limit is not None and largest > limit:
        notes.warnings.append(f"the working set ({_gb(largest)}) is beyond the host's RAM ({_gb(limit)})")
    elif limit is None:
        notes.notes.append("the working set was not checked against the host's RAM (unknown: give --host-ram)")


def _gb(value: float) -> str:
    return f"{value / 1e9:,.2f} GB"
