"""`report.md`: the verdict and the plots first, then the tables behind them."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from gateway.devtools.loadtest.model import ARMS
from gateway.devtools.loadtest.verdict import fmt_bytes

OFFLOAD_FAMILIES = (
    ("load", "vllm:kv_offload_load_bytes_total"),
    ("store", "vllm:kv_offload_store_bytes_total"),
)
TOKEN_FAMILIES = (
    ("GPU-cache hit tokens", "vllm:prefix_cache_hits_total"),
    ("CPU-tier hit tokens", "vllm:external_prefix_cache_hits_total"),
)


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:.1f}"


def _ci(ci: Sequence[float] | None) -> str:
    return "–" if not ci else f"[{ci[0] * 1000:.1f}, {ci[1] * 1000:.1f}]"


def _num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _when(ts: float | None) -> str:
    return "–" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _headline(report: dict[str, Any]) -> list[str]:
    ret = report["phases"].get("return")
    if ret is None:
        return []
    deltas = report["upstream_metrics_delta"]
    rows = []
    for arm in ARMS:
        stats = ret[arm]
        loaded = deltas.get(arm, {}).get("return", {}).get("vllm:kv_offload_load_bytes_total", 0.0)
        rows.append([arm, _ms(stats["ttft_p50_s"]), _ci(stats["ttft_ci95_s"]), _num(stats["cached_tokens_mean"]),
                     _num(stats["prompt_tokens_mean"]), fmt_bytes(loaded), str(stats["n"])])
    header = ["arm", "TTFT p50 ms", "95 % CI ms", "cached tokens (mean)", "prompt tokens", "CPU→GPU loaded", "n"]
    return ["## The return to an evicted prefix", "",
            f"ΔTTFT p50 = **{_ms(ret['delta_ttft_p50_s'])} ms** (95 % CI {_ci(ret['delta_ttft_ci95_s'])} ms).", "",
            table(header, rows), ""]


def _phases(report: dict[str, Any]) -> list[str]:
    rows = []
    for phase, entry in report["phases"].items():
        off, ctl = entry["offload"], entry["control"]
        rows.append([phase, _ms(off["ttft_p50_s"]), _ms(ctl["ttft_p50_s"]), _ms(entry["delta_ttft_p50_s"]),
                     _ci(entry["delta_ttft_ci95_s"]), _num(off["cached_tokens_mean"]), _num(ctl["cached_tokens_mean"]),
                     f"{off['n']}/{ctl['n']}", f"{off['errors']}/{ctl['errors']}"])
    header = ["phase", "offload p50 ms", "control p50 ms", "ΔTTFT p50 ms", "Δ 95 % CI ms", "offload cached",
              "control cached", "n (off/ctl)", "errors"]
    per_tenant = []
    for phase, entry in report["phases"].items():
        for tenant, stats in entry["tenants"].items():
            off, ctl = stats["offload"], stats["control"]
            per_tenant.append([phase, tenant, _ms(off["ttft_p50_s"]), _ms(ctl["ttft_p50_s"]),
                               _ms(stats["delta_ttft_p50_s"]), _ci(stats["delta_ttft_ci95_s"]),
                               _num(off["cached_tokens_mean"]), _num(ctl["cached_tokens_mean"])])
    tenant_header = ["phase", "tenant", "offload p50 ms", "control p50 ms", "ΔTTFT p50 ms", "Δ 95 % CI ms",
                     "offload cached", "control cached"]
    return ["## TTFT per phase (client-side, through the gateway)", "", "![TTFT per phase](ttft_by_phase.png)", "",
            table(header, rows), "", "### Per tenant", "", "![ΔTTFT per tenant](delta_ttft_by_tenant.png)", "",
            table(tenant_header, per_tenant), ""]


def _upstream(report: dict[str, Any]) -> list[str]:
    rows = []
    for arm in ARMS:
        for phase, samples in report["upstream_metrics_delta"].get(arm, {}).items():
            rows.append([arm, phase, *[fmt_bytes(samples.get(name, 0.0)) for _, name in OFFLOAD_FAMILIES],
                         *[_num(samples.get(name, 0.0)) for _, name in TOKEN_FAMILIES]])
    header = ["arm", "phase", *[f"offload {label}" for label, _ in OFFLOAD_FAMILIES],
              *[label for label, _ in TOKEN_FAMILIES]]
    return ["## Upstream `/metrics`, change per phase", "",
            "![offload bytes per phase](offload_bytes_by_phase.png)", "", table(header, rows), "",
            "Every changed counter is in `report.json` under `upstream_metrics_delta`.", ""]


def _ledger(report: dict[str, Any]) -> list[str]:
    rows = []
    for tenant, media in report["ledger"].items():
        for medium, stats in media.items():
            closed = ", ".join(f"{k} {v}" for k, v in (stats.get("closed_by") or {}).items()) or "–"
            rows.append([tenant, medium, str(stats.get("stored")), str(stats.get("removed")),
                         str(stats.get("resident")), _lifetime(stats.get("lifetime_p50_s")), closed])
    header = ["tenant", "medium", "stored", "removed", "resident", "lifetime p50 s", "closed by"]
    return ["## Block ledger (from the upstreams' KV events)", "",
            "![CPU-tier blocks resident per tenant](ledger_cpu_resident.png)", "", table(header, rows), "",
            "`unattributed`: blocks whose salt matches no tenant, such as those of the direct (gateway-less) "
            "baseline requests, which carry no salt.", ""]


def _lifetime(value: float | None) -> str:
    """null in the audit: no block was removed, so no lifetime was observed."""
    return "unknown" if value is None else _num(value, 1)


def _restart(report: dict[str, Any]) -> list[str]:
    info = report["restart"]
    lines = ["## Restart", ""]
    for item in info.get("restarts", []):
        status = "ok" if item["ok"] else f"failed: {item['error']}"
        lines.append(f"- `{item['arm']}` restarted in {item['seconds']:.1f} s ({status}); "
                     f"PID {item['pid_before']} → {item['pid_after']}")
    if "closed_by_restart" not in info:
        lines += ["", f"Not run: {info.get('ledger', {}).get('skipped', 'no restart phase')}.", ""]
        return lines
    right_after: dict[str, dict[str, int]] = next(
        (point["resident"] for point in report["ledger_timeline"] if point["label"] == "after restart"), {})
    rows = []
    for tenant, media in info["closed_by_restart"].items():
        for medium, reasons in media.items():
            after = right_after.get(tenant, {}).get(medium)
            rows.append([tenant, medium, str(info["resident_before"].get(tenant, {}).get(medium, 0)),
                         str(reasons["restart"]), str(reasons["lost"]), "–" if after is None else str(after),
                         str(info["resident_after"].get(tenant, {}).get(medium, 0))])
    seen = "yes" if info.get("ledger_observed") else "NOT within the time limit"
    lines += ["", f"The ledger saw the restart: {seen}.", "",
              table(["tenant", "medium", "resident before", "closed: restart", "closed: lost",
                     "resident right after", "resident after the restart phase"], rows),
              ""]
    gaps = info.get("gaps_after") or []
    if gaps:
        lines += [table(["source", "missing batches", "restarts", "lost", "closed without removal"],
                        [[g["source"], str(g.get("missing_batches")), str(g.get("restarts")), str(g.get("lost")),
                          str(g.get("closed_without_removal"))] for g in gaps]), ""]
    return lines


def _overhead(report: dict[str, Any]) -> list[str]:
    o = report["gateway_overhead"]
    share = o.get("share_of_cold_ttft_p50")
    lines = ["## What the gateway adds", "",
             f"- `x-kvgate-overhead-ms` over {o['requests']} requests: p50 {_num(o['header_ms_p50'], 3)} ms, "
             f"p99 {_num(o['header_ms_p99'], 3)} ms, max {_num(o['header_ms_max'], 3)} ms.",
             f"- `kvgate_overhead_seconds` mean: {_ms(o['metric_mean_s'])} ms over {_num(o['metric_count'])} requests.",
             f"- Share of the control arm's cold TTFT p50 ({_ms(o['cold_control_ttft_p50_s'])} ms): "
             + ("–" if share is None else f"{share * 100:.2f} %")]
    baseline = o.get("direct_vs_gateway")
    if baseline:
        lines.append(
            f"- End to end, {baseline['pairs']} pairs of fresh {report['scenario']['prefix_tokens']}-token prompts "
            f"sent straight to the control upstream and through the gateway: TTFT p50 "
            f"{_ms(baseline['direct_ttft_p50_s'])} ms direct vs {_ms(baseline['gateway_ttft_p50_s'])} ms via kvgate; "
            f"paired difference p50 {_ms(baseline['added_ttft_p50_s'])} ms "
            f"(95 % CI {_ci(baseline['added_ttft_ci95_s'])} ms), "
            f"{baseline['share_of_direct_p50'] * 100:.2f} % of the direct TTFT.")
    lines.append("")
    rows = []
    for arm, phases in o["ttft_decomposition_mean_s"].items():
        for phase, parts in phases.items():
            rows.append([arm, phase, _ms(parts["engine"]), _ms(parts["gateway"]), _ms(parts["client"])])
    if rows:
        lines += ["Mean TTFT as each layer sees it (engine: `vllm:time_to_first_token_seconds`; gateway: "
                  "`kvgate_ttft_seconds`; client: this runner):", "",
                  table(["arm", "phase", "engine ms", "gateway ms", "client ms"], rows), ""]
    return lines


def _memory(report: dict[str, Any]) -> list[str]:
    points = report["memory"]
    rows = []
    for arm in ARMS:
        values = [p["arms"][arm]["rss_bytes"] for p in points if p["arms"].get(arm, {}).get("rss_bytes")]
        if values:
            rows.append([arm, fmt_bytes(values[0]), fmt_bytes(max(values)), fmt_bytes(values[-1])])
    if not rows:
        return ["## Host memory", "", "No upstream PID was known, so no RSS was sampled.", ""]
    lines = ["## Host memory (RSS of each upstream's process tree)", "", "![RSS](memory_rss.png)", "",
             table(["arm", "first", "max", "last"], rows), ""]
    peaks = {arm: max((p["arms"][arm]["rss_bytes"] or 0) for p in points if arm in p["arms"]) for arm in ARMS}
    if all(peaks.values()):
        lines += [f"The offload arm's process tree peaked {fmt_bytes(peaks['offload'] - peaks['control'])} above the "
                  "control arm's: the host memory the CPU tier costs (its pinned buffers live in the engine core).", ""]
    return lines


def _about(report: dict[str, Any]) -> list[str]:
    scenario, env = report["scenario"], report["environment"]
    checks = report["checks"]
    lines = ["## How it ran", "",
             f"- Scenario `{scenario['name']}`: {len(scenario['tenants'])} tenants, prefix {scenario['prefix_tokens']} "
             f"tokens, {report['pressure_prompts']} pressure prompts of {scenario['pressure']['tokens']} tokens per "
             f"repetition and arm, {scenario['repetitions']} repetitions (+{scenario['warmup_repetitions']} warm-up), "
             f"concurrency {scenario['concurrency']}, max_tokens {scenario['max_tokens']}.",
             f"- Mode: {env.get('mode')}; started {_when(report['started_at'])}, "
             f"took {_num(report['duration_s'], 1)} s.",
             f"- Checks: {checks['errors']} failed requests, {checks['misrouted']} served by the wrong pool; "
             f"pressure evicted the prefix from the GPU: {checks['pressure_evicted_prefix']}.", ""]
    for key, value in sorted(env.items()):
        if key != "mode":
            lines.append(f"- {key}: `{value}`")
    return [*lines, ""]


def render_markdown(report: dict[str, Any], plots: dict[str, str]) -> str:
    scenario = report["scenario"]
    lines = [f"# Offload A/B through kvgate: {scenario['name']}", ""]
    if scenario.get("description"):
        lines += [scenario["description"].strip(), ""]
    lines += ["## Verdict", "", *[f"- {sentence}" for sentence in report["verdict"].values()], ""]
    lines += _headline(report) + _phases(report) + _upstream(report) + _ledger(report) + _restart(report)
    lines += _overhead(report) + _memory(report) + _about(report)
    missing = [name for name, status in plots.items() if status != "ok"]
    if missing:
        lines += ["## Plots not drawn", "", *[f"- `{name}`: {plots[name]}" for name in missing], ""]
    return "\n".join(lines)
