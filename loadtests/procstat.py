"""Readings from /proc (Linux only): process CPU seconds, resident memory, per-core busy time, and pinning."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MINFLT_FIELD = 7  # fields counted from the process state, i.e. after "pid (comm) "
UTIME_FIELD = 11
STIME_FIELD = 12


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()


def process_cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of every thread of `pid` so far (children not included)."""
    fields = _stat_fields(pid)
    return int(fields[UTIME_FIELD]) / CLOCK_TICKS, int(fields[STIME_FIELD]) / CLOCK_TICKS


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of every thread of `pid` so far (children not included)."""
    return sum(process_cpu_split(pid))


def minor_faults(pid: int) -> int:
    """Minor page faults of every thread of `pid` so far: first touches of memory the process had not used yet
    (or had given back), each a trip into the kernel."""
    return int(_stat_fields(pid)[MINFLT_FIELD])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def core_busy_s() -> dict[int, float]:
    """Seconds each core spent running tasks since boot (user, nice, system and steal; not idle, iowait,
    or irq/softirq, which /proc/<pid>/stat does not charge to any process), from /proc/stat."""
    busy: dict[int, float] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if name.startswith("cpu") and name != "cpu":
            user, nice, system, _idle, _iowait, _irq, _softirq, steal = (int(value) for value in values[:8])
            busy[int(name[3:])] = (user + nice + system + steal) / CLOCK_TICKS
    return busy


def pin_process(pid: int, cores: Iterable[int]) -> None:
    """Pin every current thread of `pid` to `cores`; threads it starts later inherit the mask."""
    mask = set(cores)
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), mask)


def process_affinity(pid: int) -> set[int]:
    return set(os.sched_getaffinity(pid))


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants now alive (by the parent field of /proc/<pid>/stat)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue  # ended while we looked
            parents[int(entry)] = int(text[text.rindex(")") + 2 :].split()[1])
    tree = [pid]
    for member in tree:
        tree.extend(child for child, parent in parents.items() if parent == member)
    return tree
