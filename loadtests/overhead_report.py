"""Figures of the proxy-overhead benchmark: per-phase measurements, medians, targets, the table and the JSON."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtests import pyspy
from loadtests.loadgen import PhaseStats

DIRECT = "direct"
GATEWAY = "gateway"
FOREIGN_LOAD_WARNING = 0.05  # a core this much busier than the benchmark's processes explain: results are noisy
IDLE_RSS_TARGET_MIB = 60.0  # issue 15
LOOP_FRAME = "Runner.run (asyncio/runners.py)"  # py-spy's own samples here: idle and C code under the loop
PROFILE_ROWS = 60


@dataclass(frozen=True)
class Measurement:
    """One phase: one target (direct, or a proxy) at one concurrency in one round."""

    target: str
    concurrency: int
    round: int
    stats: PhaseStats
    proxy_cpu_ms_per_request: float  # CPU of the proxy under test (NaN for direct)
    proxy_system_share: float  # of that CPU, the part spent in the kernel
    proxy_core_busy: float  # the proxy's CPU as a share of the window
    bench_processes_busy: float  # upstream + load generator CPU as a share of the window (1.0 = one core)
    core_busy: dict[str, float]  # each core group's busy share of the window (1.0 = one core), all processes
    foreign_busy: dict[str, float]  # each group's busy share that the benchmark's own processes do not explain
    requests_in_phase: int  # every request of the phase, warm-up and drain included
    gateway_side: dict[str, float]  # the gateway's own TTFT and overhead (p50/p99, from its log); gateway only

    @property
    def foreign_load(self) -> float:
        return max(self.foreign_busy.values())


@dataclass
class Summary:
    """Medians over rounds at one concurrency, and each proxy against direct."""

    concurrency: int
    by_target: dict[str, dict[str, float]] = field(default_factory=dict)
    versus_direct: dict[str, dict[str, float]] = field(default_factory=dict)


def phase_figures(measured: Measurement) -> dict[str, float]:
    stats = measured.stats
    return {
        "ttft_p50_ms": stats.ttft_p50_ms, "ttft_p99_ms": stats.ttft_p99_ms, "requests_per_s": stats.requests_per_s,
        "completed": stats.completed, "errors": stats.errors, "events_per_request": stats.events_per_request,
        "proxy_cpu_ms_per_request": measured.proxy_cpu_ms_per_request,
        "proxy_system_share": measured.proxy_system_share, "proxy_core_busy": measured.proxy_core_busy,
        "bench_processes_busy": measured.bench_processes_busy, "foreign_load": measured.foreign_load,
        **{f"gateway_side_{name}": value for name, value in measured.gateway_side.items()},
    }


def medians(rows: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(row[name] for row in rows) for name in rows[0]} if rows else {}


def summarize(measurements: Sequence[Measurement], concurrency: int, targets: Sequence[str]) -> Summary:
    summary = Summary(concurrency)
    here = [measured for measured in measurements if measured.concurrency == concurrency]
    for target in targets:
        figures = medians([phase_figures(measured) for measured in here if measured.target == target])
        if figures:
            summary.by_target[target] = figures
    direct = summary.by_target.get(DIRECT)
    for target, figures in summary.by_target.items():
        if direct is not None and target != DIRECT:
            summary.versus_direct[target] = {
                "added_ttft_p50_ms": figures["ttft_p50_ms"] - direct["ttft_p50_ms"],
                "added_ttft_p99_ms": figures["ttft_p99_ms"] - direct["ttft_p99_ms"],
                "throughput_ratio": figures["requests_per_s"] / direct["requests_per_s"],
            }
    return summary


def target_checks(summaries: Sequence[Summary]) -> dict[str, dict[str, Any]]:
    """Issue 15's targets for the gateway, where the concurrency was run."""
    gateway = {s.concurrency: {**s.by_target[GATEWAY], **s.versus_direct[GATEWAY]}
               for s in summaries if GATEWAY in s.versus_direct}
    checks: dict[str, dict[str, Any]] = {}

    def check(name: str, concurrency: int, figure: str, limit: float, at_most: bool) -> None:
        if concurrency in gateway:
            measured = gateway[concurrency][figure]
            met = measured <= limit if at_most else measured >= limit
            checks[name] = {"measured": measured, "limit": limit, "met": met}

    check("issue 15: proxy CPU per request at c=32 <= 0.45 ms", 32, "proxy_cpu_ms_per_request", 0.45, at_most=True)
    check("issue 15: proxy CPU per request at c=256 <= 0.40 ms", 256, "proxy_cpu_ms_per_request", 0.40,
          at_most=True)
    check("issue 15: added TTFT p50 at c=1 <= 0.6 ms", 1, "added_ttft_p50_ms", 0.6, at_most=True)
    check("issue 15: added TTFT p50 at c=32 <= 0.2 ms", 32, "added_ttft_p50_ms", 0.2, at_most=True)
    check("issue 15: throughput at c=256 >= 0.97x direct", 256, "throughput_ratio", 0.97, at_most=False)
    check("issue 15: proxy core busy at c=256 < 70 %", 256, "proxy_core_busy", 0.70, at_most=True)
    return checks


def idle_rss_check(idle_rss_mib: dict[str, float]) -> dict[str, dict[str, Any]]:
    """Issue 15's idle-memory target for the gateway (loadtests/idle_memory.py splits the figure)."""
    if GATEWAY not in idle_rss_mib:
        return {}
    measured = idle_rss_mib[GATEWAY]
    return {f"issue 15: gateway idle RSS <= {IDLE_RSS_TARGET_MIB:g} MiB":
            {"measured": measured, "limit": IDLE_RSS_TARGET_MIB, "met": measured <= IDLE_RSS_TARGET_MIB}}


def noise_warnings(measurements: Sequence[Measurement]) -> list[str]:
    """Phases in which a core was busier than the benchmark's own processes explain (another workload)."""
    return [
        f"round {measured.round} c={measured.concurrency} {measured.target}: {core} {foreign:.0%} busier "
        f"than the benchmark's own processes"
        for measured in measurements
        for core, foreign in measured.foreign_busy.items()
        if foreign > FOREIGN_LOAD_WARNING
    ]


def _cell(value: float | None, spec: str, width: int) -> str:
    return " " * width if value is None or math.isnan(value) else format(value, spec).rjust(width)


def _cpu_cell(ms: float, system_share: float) -> str:
    if math.isnan(ms):
        return " " * 19
    return f"{ms:8.3f} ms ({_cell(system_share, '.0%', 4)})"


def table(summaries: Sequence[Summary]) -> str:
    header = ("   c | target           | TTFT p50 / p99 ms | added p50 / p99 ms |   req/s |  × direct "
              "| proxy CPU/req (sys) | proxy core | foreign")
    lines = [header, "-" * len(header)]
    for summary in summaries:
        for target, figures in summary.by_target.items():
            versus = summary.versus_direct.get(target, {})
            added_p50, added_p99 = versus.get("added_ttft_p50_ms"), versus.get("added_ttft_p99_ms")
            lines.append(
                f"{summary.concurrency:>4} | {target:<16} "
                f"| {_cell(figures['ttft_p50_ms'], '.2f', 7)} / {_cell(figures['ttft_p99_ms'], '.2f', 7)} "
                f"| {_cell(added_p50, '+.2f', 7)} / {_cell(added_p99, '+.2f', 7)} "
                f"| {_cell(figures['requests_per_s'], '.1f', 7)} | {_cell(versus.get('throughput_ratio'), '.2f', 9)} "
                f"| {_cpu_cell(figures['proxy_cpu_ms_per_request'], figures['proxy_system_share'])} "
                f"| {_cell(figures['proxy_core_busy'], '.0%', 10)} | {_cell(figures['foreign_load'], '.0%', 7)}"
            )
    return "\n".join(lines)


def profile_summary(path: Path, measured: Measurement, rate_hz: int) -> dict[str, Any]:
    """py-spy samples as µs per request (every request of the phase). Non-blocking sampling cannot tell idle
    from C work under the event loop: both land on the loop frame, which `python_us_per_request` leaves out.
    On a busy machine a preempted process is sampled too (see noise_warnings)."""
    stacks = pyspy.read_collapsed(path)
    us_per_sample = 1e6 / rate_hz / max(1, measured.requests_in_phase)
    functions = pyspy.by_function(stacks)
    loop_own = sum(row.own for row in functions if row.function == LOOP_FRAME)
    return {
        "path": str(path), "target": measured.target, "concurrency": measured.concurrency, "rate_hz": rate_hz,
        "samples": sum(count for _, count in stacks), "phase": phase_figures(measured),
        "cpu_ms_per_request": measured.proxy_cpu_ms_per_request,
        "python_us_per_request": (sum(row.own for row in functions) - loop_own) * us_per_sample,
        "functions": [{"function": row.function, "own_us": row.own * us_per_sample,
                       "inclusive_us": row.inclusive * us_per_sample} for row in functions[:PROFILE_ROWS]],
    }


def gateway_side_lines(summaries: Sequence[Summary]) -> list[str]:
    """The gateway's own view (its log): TTFT from arrival to relaying the first content event, and overhead."""
    lines = []
    for summary in summaries:
        figures = summary.by_target.get(GATEWAY, {})
        if "gateway_side_ttft_p50_ms" in figures:
            lines.append(
                f"c={summary.concurrency}: gateway-side TTFT p50/p99 {figures['gateway_side_ttft_p50_ms']:.2f} / "
                f"{figures['gateway_side_ttft_p99_ms']:.2f} ms, overhead before upstream p50/p99 "
                f"{figures['gateway_side_overhead_p50_ms']:.3f} / {figures['gateway_side_overhead_p99_ms']:.3f} ms")
    return lines


def print_report(result: dict[str, Any], summaries: Sequence[Summary], say: Callable[[str], None]) -> None:
    say(table(summaries))
    for line in gateway_side_lines(summaries):
        say(line)
    for proxy, rss in result["idle_rss_mib"].items():
        say(f"{proxy} RSS: idle {rss:.1f} MiB, after the run {result['rss_after_mib'][proxy]:.1f} MiB")
    for name, check in result["targets"].items():
        say(f"{'met ' if check['met'] else 'MISS'}  {name}: {check['measured']:.3f}")
    for warning in result["noise_warnings"]:
        say(f"warning: {warning}")
    profile = result["profile"]
    if profile is not None:
        say(f"py-spy profile of {profile.get('target', GATEWAY)} at c={profile['concurrency']} ({profile['path']}): "
            f"{profile['cpu_ms_per_request'] * 1000:.0f} µs CPU per request, of which Python frames sampled "
            f"{profile['python_us_per_request']:.0f} µs. Functions by own time, µs per request (own / inclusive); "
            f"'{LOOP_FRAME}' own = idle + C under the event loop:")
        for row in profile["functions"][:25]:
            say(f"  {row['own_us']:7.1f} / {row['inclusive_us']:7.1f}  {row['function']}")


def without_nan(value: Any) -> Any:
    """JSON has no NaN: figures that could not be measured become null."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: without_nan(item) for key, item in value.items()}
    if isinstance(value, list):
        return [without_nan(item) for item in value]
    return value
