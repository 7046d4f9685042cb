"""The plan as a plain-text table or Markdown; "unknown" wherever a figure could not be read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.tables import table

UNKNOWN = "unknown"


def render(plan: dict[str, Any], fmt: str) -> str:
    sections = [_header(plan), _kv(plan, fmt), _budgets(plan, fmt), _windows(plan, fmt), _curve(plan, fmt),
                _admission(plan, fmt), _recommendation(plan), _warnings(plan)]
    if fmt == "md":
        return "\n\n".join(part for part in sections if part) + "\n"
    return "\n\n".join(part for part in sections if part).replace("### ", "") + "\n"


def _header(plan: dict[str, Any]) -> str:
    trace = plan["trace"]
    sampled = f"sampled at {trace['sample_rate']:.3g}" if trace["sample_rate"] < 1 else "every prefix chain"
    who = f"tenant {plan['tenant']}" if plan["tenant"] else "all tenants"
    span = trace["span_s"]
    return (f"### kvgate plan — pool {plan['pool'] or UNKNOWN}, {who}\n"
            f"trace: {trace['records']} requests ({sampled}) over {span / 60:,.1f} min, "
            f"observed cached share {_pct(trace['observed_cached_share'])}")


def _kv(plan: dict[str, Any], fmt: str) -> str:
    kv = plan["kv"]
    rows = [("KV bytes per token", _num(kv["bytes_per_token"]), kv["bytes_per_token_source"] or UNKNOWN),
            ("  from the server", _num(kv["server_bytes_per_token"]), "kv_cache_memory_bytes / kv_cache_size_tokens"),
            ("  from config.json", _num(kv["model_bytes_per_token"]), "layers x KV heads x head dim x 2 x dtype / TP"),
            ("GPU KV cache", _tokens_bytes(kv["gpu_kv_cache_tokens"], kv["gpu_kv_cache_bytes"]),
             f"block size {kv['block_size'] or UNKNOWN}"),
            ("offloading backend", kv["offloading_backend"] or UNKNOWN,
             f"kv_offloading_size {kv['offloading_size_gib']} GiB" if kv["offloading_size_gib"] is not None
             else "kv_offloading_size not set (a --kv-transfer-config tier is not shown by the server)")]
    return "### KV cache\n" + _table(("", "value", "source"), rows, fmt)


def _budgets(plan: dict[str, Any], fmt: str) -> str:
    budgets = plan.get("budgets")
    if not budgets:
        return ""
    rows = [("host RAM", _gb(budgets["host_ram_bytes"])),
            ("weights held in host RAM", _gb(budgets["weights_in_host_ram_bytes"])),
            ("headroom (OS, tokenizers, buffers)", _gb(budgets["headroom_bytes"])),
            ("cache process RSS", _gb(budgets["cache_process_rss_bytes"])),
            ("active requests (GPU KV cache, GPU memory)", _gb(budgets["active_requests_gpu_bytes"])),
            ("reusable blocks (tier at the knee)", _gb(budgets["reusable_blocks_bytes"])),
            ("RAM left for the tier", _gb(budgets["left_for_tier_bytes"]))]
    return "### Budgets\n" + _table(("budget", "bytes"), rows, fmt)


def _windows(plan: dict[str, Any], fmt: str) -> str:
    rows = [(_window(w["window_s"]), str(w["windows_in_trace"]), _num(w["prompt_tokens"]),
             _tokens_bytes(w["returning_tokens"], w["returning_bytes"]), _tokens_bytes(w["hot_tokens"], w["hot_bytes"]),
             _pct(w["one_off_share"])) for w in plan["working_set"]]
    head = ("window", "windows", "prompt tokens", "returning (distinct)", "hot set (80 % of returns)", "one-off")
    return "### Working set (busiest window)\n" + _table(head, rows, fmt)


def _curve(plan: dict[str, Any], fmt: str) -> str:
    curve = plan.get("curve")
    if not curve:
        return "### Predicted hit rates\nunknown (see warnings)"
    points = [*curve, *plan.get("evaluated", [])]
    rows = [(p["label"] or "", _tokens_bytes(p["cpu_tokens"], p["cpu_bytes"]), _pm(p, "gpu_share"), _pm(p, "cpu_share"),
             _pct(p["recomputed_share"]), _gb(p["cpu_to_gpu_bytes_per_hour"]), _num(p["load_seconds_per_hour"], 2),
             _num(p["ttft_saving_ms_per_request"], 1)) for p in points]
    head = ("", "CPU tier", "GPU cache", "CPU tier share", "recomputed", "CPU→GPU per hour", "load s/hour",
            "TTFT saving ms/req")
    return "### Predicted hit rates (two-tier LRU replay)\n" + _table(head, rows, fmt)


def _admission(plan: dict[str, Any], fmt: str) -> str:
    effect = plan.get("admission")
    if not effect:
        return ""
    rule = effect["rule"]
    rows = [(arm, _pct(effect[arm]["cpu_share"]), _pct(effect[arm]["gpu_share"]),
             _num(effect[arm]["chunks_stored"])) for arm in ("without", "with")]
    refused = effect["requests_storing_nothing_with_admission"]
    title = (f"### Offload admission on this traffic (tier at the knee; `returning`, "
             f"window {_window(rule['window_s'])}, min_seen {rule['min_seen']}): {refused} of "
             f"{effect['requests']} requests would store nothing\n")
    return title + _table(("admission", "CPU tier share", "GPU cache", "chunks stored (sampled)"), rows, fmt)


def _recommendation(plan: dict[str, Any]) -> str:
    rec = plan.get("recommendation")
    if not rec:
        return "### Recommendation\nnone (see warnings)"
    size = rec["cpu_bytes_to_use"]
    line = f"cpu_bytes_to_use: {size}  ({size / 1e9:,.2f} GB)" if size is not None else "cpu_bytes_to_use: unknown"
    return "### Recommendation\n" + line + "\n" + "\n".join(f"- {reason}" for reason in rec["reasons"])


def _warnings(plan: dict[str, Any]) -> str:
    lines = [f"- WARNING: {w}" for w in plan["warnings"]] + [f"- note: {n}" for n in plan["notes"]]
    return "### Warnings and notes\n" + "\n".join(lines) if lines else ""


def _table(head: tuple[str, ...], rows: Sequence[Sequence[str]], fmt: str) -> str:
    if fmt == "md":
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])
    return table(head, rows)


def _pm(point: dict[str, Any], key: str) -> str:
    bound = point["error_bound"][key]
    return _pct(point[key]) + (f" ±{bound * 100:.1f}" if point["error_bound"]["sampled"] else "")


def _pct(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value * 100:.1f} %"


def _num(value: float | None, digits: int = 0) -> str:
    return UNKNOWN if value is None else f"{value:,.{digits}f}"


def _gb(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value / 1e9:,.2f} GB"


def _tokens_bytes(tokens: float | None, nbytes: float | None) -> str:
    if tokens is None:
        return UNKNOWN
    return f"{tokens:,.0f} tok / {_gb(nbytes)}"


def _window(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0 and (unit != "d" or seconds > 86400):
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
