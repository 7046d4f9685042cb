"""Run the hot-plus-scan workload through a gateway, one arm after the other, and say what admission changed.

An arm is a tenant (its own key, its own policy, so its own salt) and the upstream its pool points at. Arms run
one after the other at concurrency 1, so TTFT is the server's answer to that one request. Around each arm the
upstream's `/metrics` are read (the offload byte counters are the proof of what the CPU tier stored and loaded);
against a simulator each request's CPU-loaded tokens also come from its own record (`GET /sim/requests`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.devtools.loadtest.client import Ask, stream_completion
from gateway.devtools.loadtest.promtext import accumulating_samples, pick
from loadtests.hotscan.workload import Answer, ArmSummary, HotScan, Request, requests, summarise

OFFLOAD_COUNTERS = ("vllm:kv_offload_store_bytes_total", "vllm:kv_offload_load_bytes_total",
                    "vllm:external_prefix_cache_hits_total", "vllm:prompt_tokens_total")
REQUEST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Arm:
    name: str
    gateway: str
    key: str
    upstream: str  # the arm's upstream base URL (its /metrics; /sim/requests when `sim`)
    sim: bool = False


def counters(upstream: str) -> dict[str, float]:
    samples = accumulating_samples(httpx.get(f"{upstream}/metrics", timeout=30).text)
    return {name: pick(samples, name) for name in OFFLOAD_COUNTERS}


def sim_loaded_tokens(upstream: str) -> dict[str, int]:
    """request id -> CPU-loaded tokens, from the simulator's record of what it served."""
    records = httpx.get(f"{upstream}/sim/requests", timeout=30).json()["requests"]
    return {str(r["request_id"]): int(r["loaded_tokens"]) for r in records
            if r.get("request_id") and r.get("loaded_tokens") is not None}


async def _send_all(arm: Arm, model: str, batch: Sequence[Request], max_tokens: int) -> list[Answer]:
    answers: list[Answer] = []
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
        for request in batch:
            outcome = await stream_completion(client, arm.gateway, Ask(arm.key, f"{arm.name}-user", request.prompt,
                                                                       model, max_tokens))
            answers.append(Answer(request.role, request.round, request.doc, outcome.status, outcome.ttft_s,
                                  outcome.prompt_tokens, outcome.cached_tokens, None, outcome.request_id,
                                  outcome.error))
    return answers


def run_arm(arm: Arm, spec: HotScan, model: str, max_tokens: int = 4, sim_record_limit: int = 1000,
            kv_bytes_per_token: int | None = None) -> tuple[list[Answer], ArmSummary]:
    """Send the whole workload as this arm; returns every answer and the arm's summary."""
    before = counters(arm.upstream)
    batch = requests(spec)
    answers: list[Answer] = []
    # Read the simulator's records in slices smaller than what it keeps, so none has been dropped yet.
    step = max(1, sim_record_limit // 2) if arm.sim else len(batch)
    for start in range(0, len(batch), step):
        part = asyncio.run(_send_all(arm, model, batch[start : start + step], max_tokens))
        if arm.sim:
            loaded = sim_loaded_tokens(arm.upstream)
            for answer in part:
                answer.cpu_loaded_tokens = loaded.get(answer.request_id or "")
        answers += part
    after = counters(arm.upstream)
    delta = {name: after[name] - before[name] for name in OFFLOAD_COUNTERS}
    return answers, summarise(arm.name, answers, delta, kv_bytes_per_token)


def comparison(all_arm: ArmSummary, returning: ArmSummary) -> dict[str, Any]:
    """What admission changed: hit-share ratio and the hot returns' TTFT p50 reduction (None when unknown)."""
    ratio = None
    share_all, share_returning = _share_of(all_arm), _share_of(returning)
    if share_all is not None and share_returning is not None:
        ratio = (share_returning / share_all if share_all > 0
                 else (float("inf") if share_returning > 0 else None))
    reduction = None
    if all_arm.hot_return_ttft_p50_s and returning.hot_return_ttft_p50_s is not None:
        reduction = 1 - returning.hot_return_ttft_p50_s / all_arm.hot_return_ttft_p50_s
    store_all = all_arm.upstream_delta.get("vllm:kv_offload_store_bytes_total", 0.0)
    store_ret = returning.upstream_delta.get("vllm:kv_offload_store_bytes_total", 0.0)
    return {"hot_cpu_hit_share_ratio": ratio, "hot_return_ttft_p50_reduction": reduction,
            "store_bytes_ratio": (store_ret / store_all) if store_all else None}


def _share_of(summary: ArmSummary) -> float | None:
    """The per-request share when the server records it, else the share from its load-byte counter."""
    if summary.hot_cpu_hit_share is not None:
        return summary.hot_cpu_hit_share
    return summary.hot_cpu_hit_share_from_load_bytes


def write_report(out: Path, spec: HotScan, summaries: Sequence[ArmSummary], answers: dict[str, list[Answer]],
                 notes: Sequence[str], render: Callable[[dict[str, Any]], str]) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    by_name = {summary.name: summary for summary in summaries}
    report: dict[str, Any] = {
        "schema": "kvgate-hotscan/1", "workload": spec.__dict__, "arms": {s.name: s.as_dict() for s in summaries},
        "comparison": comparison(by_name["all"], by_name["returning"]) if {"all", "returning"} <= set(by_name)
        else None,
        "notes": list(notes),
        "requests": {name: [a.__dict__ for a in arm_answers] for name, arm_answers in answers.items()},
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "summary.md").write_text(render(report))
    return report


def render_summary(report: dict[str, Any]) -> str:
    lines = ["| arm | requests | errors | hot returns | hot CPU-tier hit share (records / load bytes) | "
             "hot cached share | "
             "hot return TTFT p50 | scan TTFT p50 | CPU-tier stored | CPU-tier loaded |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, arm in report["arms"].items():
        delta = arm["upstream_delta"]
        lines.append(
            f"| {name} | {arm['requests']} | {arm['errors']} | {arm['hot_returns']} | "
            f"{_share(arm['hot_cpu_hit_share'])} / {_share(arm['hot_cpu_hit_share_from_load_bytes'])} | "
            f"{_share(arm['hot_cached_share'])} | "
            f"{_ms(arm['hot_return_ttft_p50_s'])} | {_ms(arm['scan_ttft_p50_s'])} | "
            f"{_gb(delta.get('vllm:kv_offload_store_bytes_total'))} | "
            f"{_gb(delta.get('vllm:kv_offload_load_bytes_total'))} |")
    comparison_ = report.get("comparison") or {}
    lines += ["", f"- hot CPU-tier hit share, returning / all: {_ratio(comparison_.get('hot_cpu_hit_share_ratio'))}",
              f"- hot return TTFT p50 reduction with admission: "
              f"{_pct(comparison_.get('hot_return_ttft_p50_reduction'))}",
              f"- CPU-tier bytes stored, returning / all: {_ratio(comparison_.get('store_bytes_ratio'))}"]
    return "\n".join(lines + [f"- {note}" for note in report.get("notes", [])]) + "\n"


def _share(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"


def _ms(value: float | None) -> str:
    return "unknown" if value is None else f"{value * 1000:.1f} ms"


def _gb(value: float | None) -> str:
    return "unknown" if value is None else f"{value / 1e9:.3f} GB"


def _ratio(value: float | None) -> str:
    return "unknown" if value is None else ("all-arm share 0" if value == float("inf") else f"{value:.2f}x")


def _pct(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1%}"
