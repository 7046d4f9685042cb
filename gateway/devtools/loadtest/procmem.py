"""Host memory readings from /proc: resident memory of a process and all its descendants, and MemAvailable.

vLLM keeps the CPU tier (pinned host buffers) in its engine-core child process, so the whole tree counts.
Every function returns None where /proc cannot tell (another OS, a process that has exited).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PROC = Path("/proc")
PAGE_KIB = 1024


def _parent_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = defaultdict(list)
    for entry in PROC.glob("[0-9]*"):
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        children[int(fields[1])].append(int(entry.name))
    return children


def _rss_kib(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return 0  # a kernel thread or zombie has no VmRSS line


def tree_rss_bytes(pid: int) -> int | None:
    """VmRSS of `pid` plus every descendant, in bytes (shared pages are counted once per process)."""
    if not PROC.is_dir() or _rss_kib(pid) is None:
        return None
    children = _parent_map()
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        total += _rss_kib(current) or 0
        pending.extend(children.get(current, []))
    return total * PAGE_KIB


def mem_available_bytes() -> int | None:
    try:
        for line in (PROC / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * PAGE_KIB
    except (OSError, ValueError):
        return None
    return None
