"""Send a reuse workload through the gateway and measure where its prompt tokens came from.

The measurement is the upstream's own counters, read before and after: `vllm:prefix_cache_hits_total` (GPU
prefix-cache hits), `vllm:external_prefix_cache_hits_total` (tokens the connector loaded: the CPU tier), and
`vllm:prompt_tokens_total`; plus `usage.prompt_tokens_details.cached_tokens` summed over the answers (GPU and
CPU together). The upstream must serve this workload alone while it runs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from gateway.devtools.loadtest.promtext import Samples, accumulating_samples, delta, pick
from gateway.devtools.loadtest.workloads import WorkloadSpec, generate, request_body

MEASURED = ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total", "vllm:prompt_tokens_total",
            "vllm:kv_offload_load_bytes_total", "vllm:kv_offload_store_bytes_total")


@dataclass(frozen=True)
class WorkloadTarget:
    """Where a workload is sent and as whom, and where the upstream's counters are read."""

    gateway_url: str
    key: str
    model: str
    max_tokens: int
    metrics_url: str | None = None  # the upstream's /metrics; None: no before/after counters


@dataclass
class WorkloadResult:
    started_at: float
    finished_at: float = 0.0
    requests: int = 0
    failures: int = 0
    usage_prompt_tokens: int = 0
    usage_cached_tokens: int = 0
    upstream_delta: Samples = field(default_factory=dict)
    per_request: list[tuple[int, int]] = field(default_factory=list)  # (prompt, cached) tokens, in order

    @property
    def prompt_tokens(self) -> float:
        return self.upstream_delta.get("vllm:prompt_tokens_total", 0.0) or float(self.usage_prompt_tokens)

    @property
    def gpu_share(self) -> float | None:
        if not self.prompt_tokens or "vllm:prefix_cache_hits_total" not in self.upstream_delta:
            return None
        return self.upstream_delta["vllm:prefix_cache_hits_total"] / self.prompt_tokens

    @property
    def cpu_share(self) -> float | None:
        if not self.prompt_tokens or "vllm:external_prefix_cache_hits_total" not in self.upstream_delta:
            return None
        return self.upstream_delta["vllm:external_prefix_cache_hits_total"] / self.prompt_tokens

    @property
    def usage_cached_share(self) -> float | None:
        return self.usage_cached_tokens / self.usage_prompt_tokens if self.usage_prompt_tokens else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_share": self.gpu_share, "cpu_share": self.cpu_share,
                "usage_cached_share": self.usage_cached_share}


async def upstream_samples(http: httpx.AsyncClient, metrics_url: str) -> Samples:
    response = await http.get(metrics_url)
    response.raise_for_status()
    return accumulating_samples(response.text)


async def run_workload(http: httpx.AsyncClient, target: WorkloadTarget, spec: WorkloadSpec) -> WorkloadResult:
    """Replay the workload one request after another (paced at `spec.rate` when it is set)."""
    metrics_url = target.metrics_url
    before = await upstream_samples(http, metrics_url) if metrics_url else {}
    result = WorkloadResult(started_at=time.time())
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {target.key}"}
    for request in generate(spec):
        if spec.rate > 0:
            await _pace(start + request.index / spec.rate)
        route, body = request_body(request, spec, target.model, target.max_tokens)
        response = await http.post(f"{target.gateway_url}{route}", json=body, headers=headers)
        result.requests += 1
        if response.status_code != 200:
            result.failures += 1
            continue
        usage = _mapping(_json(response), "usage")
        details = _mapping(usage, "prompt_tokens_details")
        prompt, cached = _tokens(usage.get("prompt_tokens")), _tokens(details.get("cached_tokens"))
        result.usage_prompt_tokens += prompt
        result.usage_cached_tokens += cached
        result.per_request.append((prompt, cached))
    result.finished_at = time.time()
    if metrics_url:
        after = await upstream_samples(http, metrics_url)
        changed = delta(before, after, always=MEASURED)
        result.upstream_delta = {name: pick(changed, name) for name in MEASURED}
    return result


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:  # an answer of another shape counts as no usage, never as a crash of the replay
        return None


def _mapping(parent: Any, key: str) -> dict[str, Any]:
    value = parent.get(key) if isinstance(parent, dict) else None
    return value if isinstance(value, dict) else {}


def _tokens(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


async def _pace(at: float) -> None:
    wait = at - time.monotonic()
    if wait > 0:
        await asyncio.sleep(wait)  # the workload's own arrival schedule, not a synchronisation
