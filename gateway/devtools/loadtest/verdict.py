"""One sentence per tenant: did the CPU tier serve the return to the evicted prefix, and on what evidence.

Served means: the offload arm's returns were cached (GPU miss, CPU hit) beyond what the control arm's were,
and `vllm:kv_offload_load_bytes_total` rose during them (per request when measured at concurrency 1,
else for the whole phase on the offload upstream).
"""

from __future__ import annotations

from typing import Any

LOAD_BYTES = "vllm:kv_offload_load_bytes_total"


def fmt_bytes(value: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B"


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1000:.0f} ms"


def _ci_ms(ci: list[float] | None) -> str:
    return "" if not ci else f", 95 % CI [{ci[0] * 1000:+.0f}, {ci[1] * 1000:+.0f}] ms"


def _load_evidence(report: dict[str, Any], tenant_return: dict[str, Any]) -> tuple[float, str]:
    per_tenant = tenant_return["offload"].get("offload_load_bytes")
    if per_tenant is not None:
        return float(per_tenant), "over this tenant's return requests"
    phase = report["upstream_metrics_delta"].get("offload", {}).get("return", {})
    return float(phase.get(LOAD_BYTES, 0.0)), "on the offload upstream during the return phase (all tenants)"


def _timing(tenant_return: dict[str, Any]) -> str:
    offload, control = tenant_return["offload"], tenant_return["control"]
    delta = tenant_return.get("delta_ttft_p50_s")
    ci = tenant_return.get("delta_ttft_ci95_s")
    direction = ""
    if ci and ci[1] < 0:
        direction = " — faster, the interval excludes 0"
    elif ci and ci[0] > 0:
        direction = " — slower, the interval excludes 0"
    elif ci:
        direction = " — no clear difference"
    shift = "n/a" if delta is None else f"{delta * 1000:+.0f} ms"
    return (f"return TTFT p50 {_ms(offload.get('ttft_p50_s'))} offload vs {_ms(control.get('ttft_p50_s'))} control "
            f"(ΔTTFT {shift}{_ci_ms(ci)}{direction})")


def tenant_verdict(report: dict[str, Any], tenant: str) -> str:
    tenant_return = report["phases"].get("return", {}).get("tenants", {}).get(tenant)
    if tenant_return is None:
        return f"{tenant}: not measured (no return phase for this tenant)."
    offload, control = tenant_return["offload"], tenant_return["control"]
    cached_offload = offload.get("cached_tokens_mean") or 0.0
    cached_control = control.get("cached_tokens_mean") or 0.0
    prompt = offload.get("prompt_tokens_mean") or control.get("prompt_tokens_mean") or 0.0
    loaded, scope = _load_evidence(report, tenant_return)
    repeat_load = report["upstream_metrics_delta"].get("offload", {}).get("repeat", {}).get(LOAD_BYTES, 0.0)
    cpu_stored = report["ledger"].get(tenant, {}).get("CPU", {}).get("stored")
    ledger = "" if cpu_stored is None else f"; the ledger attributes {cpu_stored} CPU-tier blocks stored to {tenant}"
    evidence = (f"{cached_offload:.0f} of {prompt:.0f} prompt tokens cached on return with offload vs "
                f"{cached_control:.0f} on control; {LOAD_BYTES} rose by {fmt_bytes(loaded)} {scope} "
                f"(by {fmt_bytes(repeat_load)} during repeat); {_timing(tenant_return)}{ledger}.")
    if loaded > 0 and cached_offload > cached_control:
        return f"{tenant}: yes, the CPU tier served the return: {evidence}"
    reason = _reason(loaded, cached_control, prompt, cpu_stored)
    return f"{tenant}: no, the CPU tier did not serve the return; {reason}. Evidence: {evidence}"


def _reason(loaded: float, cached_control: float, prompt: float, cpu_stored: int | None) -> str:
    if prompt and cached_control >= prompt / 2:
        return "the pressure did not evict the prefix from the GPU cache, so the return was a GPU hit on both arms"
    if cpu_stored == 0:
        return "no block of this tenant reached the CPU tier (is its max_offload_tokens 0?)"
    if loaded <= 0:
        return "nothing was loaded from the CPU tier (evicted from it too, or is its max_load_tokens 0?)"
    return "the offload arm cached no more than the control arm"


def verdicts(report: dict[str, Any], tenants: list[str]) -> dict[str, str]:
    return {tenant: tenant_verdict(report, tenant) for tenant in tenants}
