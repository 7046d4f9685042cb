"""From the raw run to `report.json`: per-phase and per-tenant summaries, ΔTTFT, overhead, ledger, verdicts.

ΔTTFT = TTFT(offload) − TTFT(control): `delta_ttft_p50_s` is the difference of the two arms' medians, and
`delta_ttft_ci95_s` its percentile-bootstrap 95 % interval (arms resampled independently).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.devtools.loadtest.model import ARMS, PHASE_ORDER
from gateway.devtools.loadtest.promtext import pick
from gateway.devtools.loadtest.runner import RawRun
from gateway.devtools.loadtest.stats import mean, median_ci, median_difference_ci, quantile
from gateway.devtools.loadtest.verdict import verdicts

SCHEMA = "kvgate-loadtest/1"
Row = dict[str, Any]
LOAD_BYTES = "vllm:kv_offload_load_bytes_total"


def measured_rows(raw: RawRun) -> list[Row]:
    return [row for row in raw.requests if not row["warmup"] and row["role"] != "probe"]


def _ok(row: Row) -> bool:
    return row["status"] == 200 and row["error"] is None and row["ttft_s"] is not None


def arm_summary(rows: list[Row]) -> dict[str, Any]:
    good = [row for row in rows if _ok(row)]
    ttfts = [row["ttft_s"] for row in good]
    cached = [row["cached_tokens"] for row in good if row["cached_tokens"] is not None]
    prompts = [row["prompt_tokens"] for row in good if row["prompt_tokens"] is not None]
    # the share only over answers that reported both: an unknown cached count is not a 0
    both = [(row["cached_tokens"], row["prompt_tokens"]) for row in good
            if row["cached_tokens"] is not None and row["prompt_tokens"] is not None]
    both_prompts = sum(prompt for _, prompt in both)
    overhead = [row["overhead_ms"] for row in good if row["overhead_ms"] is not None]
    with_delta = [row for row in good if row.get("upstream_delta")]
    ci = median_ci(ttfts)
    summary: dict[str, Any] = {
        "n": len(rows), "errors": len(rows) - len(good),
        "ttft_p50_s": quantile(ttfts, 0.5), "ttft_p90_s": quantile(ttfts, 0.9), "ttft_mean_s": mean(ttfts),
        "ttft_min_s": min(ttfts, default=None), "ttft_max_s": max(ttfts, default=None),
        "ttft_ci95_s": list(ci) if ci else None,
        "cached_tokens_mean": mean(cached), "prompt_tokens_mean": mean(prompts),
        "cached_share": sum(hit for hit, _ in both) / both_prompts if both_prompts else None,
        "overhead_ms_p50": quantile(overhead, 0.5),
        "misrouted": sum(bool(row.get("misrouted")) for row in rows),
    }
    if with_delta:
        summary["offload_load_bytes"] = sum(row["upstream_delta"].get(LOAD_BYTES, 0.0) for row in with_delta)
    return summary


def _delta_fields(offload: list[Row], control: list[Row]) -> dict[str, Any]:
    treated = [row["ttft_s"] for row in offload if _ok(row)]
    baseline = [row["ttft_s"] for row in control if _ok(row)]
    low, high = quantile(treated, 0.5), quantile(baseline, 0.5)
    ci = median_difference_ci(treated, baseline)
    return {"delta_ttft_p50_s": (low - high) if low is not None and high is not None else None,
            "delta_ttft_ci95_s": list(ci) if ci else None}


def phase_summaries(rows: list[Row], tenants: list[str]) -> dict[str, Any]:
    phases: dict[str, Any] = {}
    for phase in PHASE_ORDER:
        in_phase = [row for row in rows if row["phase"] == phase]
        if not in_phase:
            continue
        by_arm = {arm: [row for row in in_phase if row["arm"] == arm] for arm in ARMS}
        entry: dict[str, Any] = {arm: arm_summary(by_arm[arm]) for arm in ARMS}
        entry.update(_delta_fields(by_arm["offload"], by_arm["control"]))
        entry["tenants"] = {}
        for tenant in tenants:
            mine = {arm: [row for row in by_arm[arm] if row["tenant"] == tenant] for arm in ARMS}
            if any(mine.values()):
                entry["tenants"][tenant] = {**{arm: arm_summary(mine[arm]) for arm in ARMS},
                                            **_delta_fields(mine["offload"], mine["control"])}
        phases[phase] = entry
    return phases


def gateway_overhead(raw: RawRun, rows: list[Row], phases: dict[str, Any]) -> dict[str, Any]:
    headers = [row["overhead_ms"] for row in rows if _ok(row) and row["overhead_ms"] is not None]
    run = raw.gateway_run_delta
    count = pick(run, "kvgate_overhead_seconds_count")
    metric_mean = pick(run, "kvgate_overhead_seconds_sum") / count if count else None
    cold = phases.get("cold", {}).get("control", {}).get("ttft_p50_s")
    p50_ms = quantile(headers, 0.5)
    return {
        "header_ms_p50": p50_ms, "header_ms_p90": quantile(headers, 0.9), "header_ms_p99": quantile(headers, 0.99),
        "header_ms_max": max(headers, default=None), "header_ms_mean": mean(headers), "requests": len(headers),
        "metric_mean_s": metric_mean, "metric_count": count,
        "cold_control_ttft_p50_s": cold,
        "share_of_cold_ttft_p50": (p50_ms / 1000 / cold) if p50_ms is not None and cold else None,
        "ttft_decomposition_mean_s": _decomposition(raw, phases),
        "direct_vs_gateway": direct_vs_gateway(rows),
    }


def direct_vs_gateway(rows: list[Row]) -> dict[str, Any] | None:
    """The paired baseline: fresh prompts straight to the control upstream vs through the gateway."""
    pairs: dict[int, dict[str, float]] = {}
    for row in rows:
        if row["phase"] == "overhead" and _ok(row):
            pairs.setdefault(row["rep"], {})[row["role"]] = row["ttft_s"]
    complete = [(pair["direct"], pair["gateway"]) for pair in pairs.values() if len(pair) == 2]
    if not complete:
        return None
    added = [gateway - direct for direct, gateway in complete]
    direct_p50 = quantile([direct for direct, _ in complete], 0.5)
    added_p50 = quantile(added, 0.5)
    ci = median_ci(added)
    return {"pairs": len(complete), "direct_ttft_p50_s": direct_p50,
            "gateway_ttft_p50_s": quantile([gateway for _, gateway in complete], 0.5),
            "added_ttft_p50_s": added_p50, "added_ttft_ci95_s": list(ci) if ci else None,
            "share_of_direct_p50": (added_p50 / direct_p50) if added_p50 is not None and direct_p50 else None}


def _decomposition(raw: RawRun, phases: dict[str, Any]) -> dict[str, Any]:
    """Per arm and phase: mean TTFT seen by the engine, by the gateway, and by the client."""
    pools = {arm: raw.scenario["arms"][arm]["pool"] for arm in ARMS}
    out: dict[str, Any] = {}
    for phase, gateway in raw.gateway_metrics_delta.items():
        for arm in ARMS:
            engine = raw.upstream_metrics_delta.get(arm, {}).get(phase, {})
            engine_n = engine.get("vllm:time_to_first_token_seconds_count", 0.0)
            gateway_n = pick(gateway, "kvgate_ttft_seconds_count", pool=pools[arm])
            out.setdefault(arm, {})[phase] = {
                "engine": engine.get("vllm:time_to_first_token_seconds_sum", 0.0) / engine_n if engine_n else None,
                "gateway": pick(gateway, "kvgate_ttft_seconds_sum", pool=pools[arm]) / gateway_n if gateway_n else None,
                "client": phases.get(phase, {}).get(arm, {}).get("ttft_mean_s"),
            }
    return out


def ledger_view(audit: dict[str, Any] | None) -> dict[str, Any]:
    return {tenant: {medium: stats for medium, stats in media.items() if isinstance(stats, dict)}
            for tenant, media in (audit or {}).get("tenants", {}).items()}


def restart_view(raw: RawRun) -> dict[str, Any]:
    info = raw.ledger_restart
    if not info or "skipped" in info:
        return {"restarts": raw.restarts, "ledger": info}
    before, after = ledger_view(info.get("before")), ledger_view(info.get("after"))
    closed: dict[str, dict[str, dict[str, int]]] = {}
    resident_before: dict[str, dict[str, int]] = {}
    for tenant, media in after.items():
        for medium, stats in media.items():
            old = before.get(tenant, {}).get(medium, {})
            was = old.get("closed_by", {})
            now = stats.get("closed_by", {})
            closed.setdefault(tenant, {})[medium] = {reason: int(now.get(reason, 0)) - int(was.get(reason, 0))
                                                     for reason in ("restart", "lost")}
            resident_before.setdefault(tenant, {})[medium] = int(old.get("resident", 0))
    return {
        "restarts": raw.restarts, "pools": info.get("pools"), "ledger_observed": info.get("observed"),
        "closed_by_restart": closed, "resident_before": resident_before,
        "resident_after": {t: {m: int(s.get("resident", 0)) for m, s in media.items()} for t, media in after.items()},
        "gaps_before": (info.get("before") or {}).get("gaps"), "gaps_after": (info.get("after") or {}).get("gaps"),
    }


def ledger_timeline(raw: RawRun) -> list[dict[str, Any]]:
    return [{"t": point["t"], "label": point["label"], "phase": point["phase"], "rep": point["rep"],
             "resident": {tenant: {medium: stats["resident"] for medium, stats in media.items()}
                          for tenant, media in point["ledger"].items()}}
            for point in raw.timeline]


def memory_timeline(raw: RawRun) -> list[dict[str, Any]]:
    return [{"t": point["t"], "label": point["label"], **point["memory"]} for point in raw.timeline]


def checks(rows: list[Row], phases: dict[str, Any], prefix_tokens: int) -> dict[str, Any]:
    control_return = phases.get("return", {}).get("control", {}).get("cached_tokens_mean")
    return {
        "errors": sum(not _ok(row) for row in rows),
        "misrouted": sum(bool(row.get("misrouted")) for row in rows),
        "pressure_evicted_prefix": None if control_return is None else control_return < prefix_tokens / 2,
        "control_return_cached_tokens_mean": control_return,
    }


def build_report(raw: RawRun) -> dict[str, Any]:
    rows = measured_rows(raw)
    tenants = [tenant["name"] for tenant in raw.scenario["tenants"]]
    phases = phase_summaries(rows, tenants)
    report: dict[str, Any] = {
        "schema": SCHEMA, "scenario": raw.scenario, "environment": raw.environment,
        "started_at": raw.started_at, "finished_at": raw.finished_at,
        "duration_s": (raw.finished_at - raw.started_at) if raw.finished_at else None,
        "pressure_prompts": raw.pressure_prompts,
        "phases": phases,
        "upstream_metrics_delta": raw.upstream_metrics_delta,
        "gateway_metrics_delta": raw.gateway_metrics_delta,
        "gateway_overhead": gateway_overhead(raw, rows, phases),
        "ledger": ledger_view(raw.audit_final),
        "ledger_gaps": (raw.audit_final or {}).get("gaps"),
        "ledger_timeline": ledger_timeline(raw),
        "restart": restart_view(raw),
        "memory": memory_timeline(raw),
        "shadow": raw.shadow_final,
        "checks": checks(rows, phases, int(raw.scenario["prefix_tokens"])),
    }
    report["verdict"] = verdicts(report, tenants)
    report["requests"] = raw.requests
    return report


def rows_of(report: dict[str, Any], phase: str, arm: str, tenant: str | None = None) -> Iterable[Row]:
    for row in report["requests"]:
        if (row["phase"] == phase and row["arm"] == arm and not row["warmup"] and row["role"] != "probe"
                and (tenant is None or row["tenant"] == tenant)):
            yield row
