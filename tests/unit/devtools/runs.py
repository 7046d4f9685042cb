"""Hand-made load-test runs for the summary, verdict, Markdown, plot and CLI tests: rows as the runner writes
them, and one small run whose every figure can be worked out by hand."""

from __future__ import annotations

from typing import Any

from gateway.devtools.loadtest.model import Scenario, TenantSpec
from gateway.devtools.loadtest.runner import RawRun

LOAD = "vllm:kv_offload_load_bytes_total"


def row(tenant: str = "acme", arm: str = "offload", phase: str = "return", ttft: float | None = 0.1, *,
        rep: int = 0, cached: int | None = 0, prompt: int | None = 100, overhead: float | None = 1.0,
        status: int = 200, error: str | None = None, warmup: bool = False, role: str = "prefix",
        misrouted: bool = False, upstream_delta: dict[str, float] | None = None) -> dict[str, Any]:
    return {"tenant": tenant, "arm": arm, "phase": phase, "rep": rep, "role": role, "warmup": warmup,
            "prompt_len": 100, "status": status, "ttft_s": ttft, "total_s": 0.5, "started_at": 0.0,
            "pool": arm, "overhead_ms": overhead, "request_id": None, "prompt_tokens": prompt,
            "cached_tokens": cached, "error": error, "misrouted": misrouted, "upstream_delta": upstream_delta}


def hand_run() -> RawRun:
    """One tenant, one measured return per arm (offload 100 ms with 90 of 100 cached and 2 MB loaded, control
    300 ms), one cold request per arm, a warm-up row, gateway and upstream counter deltas, a final audit."""
    scenario = Scenario(name="hand", tenants=[TenantSpec(name="acme")], prefix_tokens=100).model_dump(mode="json")
    requests = [row(arm="offload", ttft=0.1, cached=90, upstream_delta={LOAD: 2e6}),
                row(arm="control", ttft=0.3, cached=0),
                row(arm="offload", phase="cold", ttft=1.0, overhead=2.0),
                row(arm="control", phase="cold", ttft=1.0, overhead=4.0),
                row(arm="offload", ttft=5.0, warmup=True)]
    gateway = {"return": {'kvgate_ttft_seconds_sum{pool="offload"}': 0.2, 'kvgate_ttft_seconds_count{pool="offload"}':
                          2.0}}
    upstream = {"offload": {"return": {"vllm:time_to_first_token_seconds_sum": 0.08,
                                       "vllm:time_to_first_token_seconds_count": 1.0, LOAD: 2e6}}}
    return RawRun(scenario, {"mode": "test"}, 3, requests=requests, upstream_metrics_delta=upstream,
                  gateway_metrics_delta=gateway,
                  gateway_run_delta={"kvgate_overhead_seconds_sum": 0.006, "kvgate_overhead_seconds_count": 4.0},
                  audit_final={"tenants": {"acme": {"CPU": {"stored": 12, "resident": 3}}}, "gaps": []},
                  timeline=[{"t": 1.0, "label": "start", "phase": None, "rep": None,
                             "ledger": {"acme": {"CPU": {"resident": 3, "stored": 12}}},
                             "memory": {"arms": {}, "host_mem_available_bytes": None}}],
                  started_at=100.0, finished_at=160.0)
