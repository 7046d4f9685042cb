"""The predicted hit-rate curve as a PNG (matplotlib, from the `loadtest` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def draw_curve(plan: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = plan.get("curve") or []
    if not curve:
        raise ValueError("no curve to draw (see the plan's warnings)")
    in_bytes = all(point["cpu_bytes"] is not None for point in curve)
    xs = [(p["cpu_bytes"] / 1e9 if in_bytes else p["cpu_tokens"]) for p in curve]
    gpu = [p["gpu_share"] * 100 for p in curve]
    cpu = [(p["gpu_share"] + p["cpu_share"]) * 100 for p in curve]
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.fill_between(xs, 0, gpu, step=None, alpha=0.5, label="GPU prefix cache")
    axes.fill_between(xs, gpu, cpu, alpha=0.5, label="CPU tier")
    knee = plan.get("knee")
    if knee is not None:
        x = knee["cpu_bytes"] / 1e9 if in_bytes else knee["cpu_tokens"]
        axes.axvline(x, color="black", linestyle="--", linewidth=1, label="knee")
    rec = plan.get("recommendation") or {}
    if rec.get("cpu_bytes_to_use") and in_bytes:
        axes.axvline(rec["cpu_bytes_to_use"] / 1e9, color="red", linewidth=1, label="recommended")
    axes.set_xlabel("CPU tier size (GB)" if in_bytes else "CPU tier size (tokens)")
    axes.set_ylabel("share of prompt tokens served (%)")
    axes.set_ylim(0, 100)
    axes.set_title(f"kvgate plan: pool {plan.get('pool')}")
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
