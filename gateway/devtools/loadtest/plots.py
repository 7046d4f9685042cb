"""PNG plots of a report (matplotlib, the optional `loadtest` extra). Each plot is independent; a missing
matplotlib or a plot without data is reported, never fatal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from gateway.devtools.loadtest.model import ARMS, PHASE_ORDER

ARM_COLORS = {"offload": "#1b7837", "control": "#762a83"}
TENANT_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
PLOT_NAMES = ("ttft_by_phase.png", "delta_ttft_by_tenant.png", "offload_bytes_by_phase.png",
              "ledger_cpu_resident.png", "memory_rss.png")


class NoData(Exception):
    """Nothing to draw for this plot."""


def draw_all(report: dict[str, Any], out_dir: Path) -> dict[str, str]:
    """Write every plot; returns file name -> "ok" or why it was not drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return dict.fromkeys(PLOT_NAMES, "matplotlib is not installed (pip install 'kvgate[loadtest]')")
    painters: dict[str, Callable[[Any, dict[str, Any]], None]] = {
        "ttft_by_phase.png": _ttft_by_phase, "delta_ttft_by_tenant.png": _delta_by_tenant,
        "offload_bytes_by_phase.png": _offload_bytes, "ledger_cpu_resident.png": _ledger_resident,
        "memory_rss.png": _memory,
    }
    status: dict[str, str] = {}
    for name, paint in painters.items():
        figure, axes = plt.subplots(figsize=(9, 4.8), dpi=110)
        try:
            paint(axes, report)
            figure.tight_layout()
            figure.savefig(out_dir / name)
            status[name] = "ok"
        except NoData as reason:
            status[name] = f"no data: {reason}"
        finally:
            plt.close(figure)
    return status


@dataclass
class _CiBars:
    """Bars in ms with their 95 % confidence interval as whiskers, gathered one bar at a time."""

    xs: list[float] = field(default_factory=list)
    heights: list[float] = field(default_factory=list)
    below: list[float] = field(default_factory=list)  # whisker lengths down to the interval's low end
    above: list[float] = field(default_factory=list)

    def add(self, x: float, value_s: float, ci95_s: Sequence[float]) -> None:
        value = value_s * 1000
        low, high = (bound * 1000 for bound in ci95_s)
        self.xs.append(x)
        self.heights.append(value)
        self.below.append(max(value - low, 0.0))
        self.above.append(max(high - value, 0.0))

    def draw(self, axes: Any, width: float, **style: Any) -> None:
        axes.bar(self.xs, self.heights, width, yerr=[self.below, self.above], **style)


def _label_phase_bars(axes: Any, phases: Sequence[str], ylabel: str, title: str) -> None:
    """The frame of a bar plot with one group of bars per phase."""
    axes.set_xticks(range(len(phases)), phases)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.legend()
    axes.grid(axis="y", alpha=0.3)


def _phases(report: dict[str, Any]) -> list[str]:
    return [phase for phase in PHASE_ORDER if phase in report["phases"]]


def _ttft_by_phase(axes: Any, report: dict[str, Any]) -> None:
    phases = _phases(report)
    if not phases:
        raise NoData("no measured phase")
    width = 0.38
    for offset, arm in zip((-width / 2, width / 2), ARMS, strict=True):
        bars = _CiBars()
        for index, phase in enumerate(phases):
            stats = report["phases"][phase][arm]
            if stats["ttft_p50_s"] is None:
                continue
            bars.add(index + offset, stats["ttft_p50_s"], stats["ttft_ci95_s"])
            points = [row["ttft_s"] * 1000 for row in report["requests"] if row["phase"] == phase and row["arm"] == arm
                      and not row["warmup"] and row["role"] != "probe" and row["ttft_s"] is not None]
            axes.scatter([index + offset] * len(points), points, s=9, color="black", alpha=0.35, zorder=3)
        bars.draw(axes, width, capsize=4, color=ARM_COLORS[arm], alpha=0.85, label=arm)
    _label_phase_bars(axes, phases, "client TTFT, ms (bar: median, whisker: 95 % CI, dots: requests)",
                      "TTFT per phase and arm, through the gateway")


def _delta_by_tenant(axes: Any, report: dict[str, Any]) -> None:
    phases = _phases(report)
    tenants = sorted({tenant for phase in phases for tenant in report["phases"][phase]["tenants"]})
    if not tenants:
        raise NoData("no per-tenant phases")
    width = 0.8 / len(tenants)
    for number, tenant in enumerate(tenants):
        bars = _CiBars()
        for index, phase in enumerate(phases):
            stats = report["phases"][phase]["tenants"].get(tenant)
            if not stats or stats["delta_ttft_p50_s"] is None:
                continue
            bars.add(index - 0.4 + width * (number + 0.5), stats["delta_ttft_p50_s"], stats["delta_ttft_ci95_s"])
        bars.draw(axes, width, capsize=3, color=TENANT_COLORS[number % len(TENANT_COLORS)], label=tenant)
    axes.axhline(0, color="black", linewidth=0.8)
    _label_phase_bars(axes, phases, "ΔTTFT p50 = offload − control, ms (95 % CI)",
                      "ΔTTFT per tenant and phase (below 0: the CPU tier helped)")


def _offload_bytes(axes: Any, report: dict[str, Any]) -> None:
    deltas = report["upstream_metrics_delta"].get("offload", {})
    phases = [phase for phase in PHASE_ORDER if phase in deltas]
    if not phases:
        raise NoData("the offload upstream's /metrics was not read")
    width = 0.38
    series = (("CPU → GPU (load)", "vllm:kv_offload_load_bytes_total", "#2166ac"),
              ("GPU → CPU (store)", "vllm:kv_offload_store_bytes_total", "#b2182b"))
    for offset, (label, name, color) in zip((-width / 2, width / 2), series, strict=True):
        values = [deltas[phase].get(name, 0.0) / 1e9 for phase in phases]
        bars = axes.bar([i + offset for i in range(len(phases))], values, width, label=label, color=color)
        axes.bar_label(bars, fmt="%.2f", fontsize=8)
    _label_phase_bars(axes, phases, "GB moved, summed over repetitions",
                      "Offload arm: vllm:kv_offload_{load,store}_bytes_total per phase")


PHASE_SHADES = {"cold": "#deebf7", "repeat": "#e5f5e0", "pressure": "#fee6ce", "return": "#efedf5",
                "restart": "#fde0dd"}


def _mark_restarts(axes: Any, report: dict[str, Any], start: float) -> None:
    finished = [item["finished_at"] for item in report["restart"].get("restarts", []) if item.get("finished_at")]
    if finished:
        at = max(finished) - start
        axes.axvline(at, color="red", linestyle="--", linewidth=1)
        axes.annotate("upstreams restarted", (at, 1), xycoords=("data", "axes fraction"), rotation=90, fontsize=7,
                      color="red", xytext=(3, -4), textcoords="offset points", va="top")


def _shade_phases(axes: Any, points: list[dict[str, Any]], start: float) -> None:
    """Each interval between two samples belongs to the phase that ended at the later one."""
    labelled: set[str] = set()
    for previous, point in pairwise(points):
        phase = point.get("phase")
        if phase not in PHASE_SHADES:
            continue
        axes.axvspan(previous["t"] - start, point["t"] - start, color=PHASE_SHADES[phase], zorder=0,
                     label=phase if phase not in labelled else None)
        labelled.add(phase)


def _ledger_resident(axes: Any, report: dict[str, Any]) -> None:
    points = report["ledger_timeline"]
    named = {tenant["name"] for tenant in report["scenario"]["tenants"]}
    seen = {tenant for point in points for tenant, media in point["resident"].items() if media.get("CPU")}
    tenants = sorted({tenant for point in points for tenant in point["resident"]} & (named | seen))
    if not points or not tenants:
        raise NoData("the audit was not read")
    start = points[0]["t"]
    _shade_phases(axes, points, start)
    xs = [point["t"] - start for point in points]
    below = [0.0] * len(points)
    for number, tenant in enumerate(tenants):
        counts = [point["resident"].get(tenant, {}).get("CPU", 0) for point in points]
        above = [base + count for base, count in zip(below, counts, strict=True)]
        axes.fill_between(xs, below, above, step="post", color=TENANT_COLORS[number % len(TENANT_COLORS)],
                          alpha=0.85, label=f"tenant {tenant}", zorder=2)
        below = above
    _mark_restarts(axes, report, start)
    axes.set_xlabel("seconds since start (the audit is read after each phase; shading: the phase that ended)")
    axes.set_ylabel("CPU-tier blocks resident (stacked)")
    axes.set_title("CPU-tier blocks resident per tenant, from the ledger's KV events")
    axes.legend(fontsize=8, ncol=2, loc="upper left")
    axes.grid(alpha=0.3, zorder=1)


def _memory(axes: Any, report: dict[str, Any]) -> None:
    points = report["memory"]
    drawn = False
    start = points[0]["t"] if points else 0.0
    for arm in ARMS:
        pairs = [(p["t"] - start, p["arms"][arm]["rss_bytes"] / 1e9) for p in points
                 if p["arms"].get(arm, {}).get("rss_bytes")]
        if pairs:
            axes.step([x for x, _ in pairs], [y for _, y in pairs], where="post", label=arm, color=ARM_COLORS[arm])
            drawn = True
    if not drawn:
        raise NoData("no upstream PID was known")
    _mark_restarts(axes, report, start)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("seconds since start")
    axes.set_ylabel("RSS of the process tree, GB")
    axes.set_title("Host memory of each upstream")
    axes.legend()
    axes.grid(alpha=0.3)
