"""Record a running process with py-spy and summarise its collapsed stacks by function."""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT_S = 30.0


LINE_NUMBER = re.compile(r":\d+\)$")


@dataclass(frozen=True)
class FunctionSamples:
    function: str  # "qualified.name (file)", line numbers dropped
    own: int  # samples with this function as the innermost frame
    inclusive: int  # samples with this function anywhere on the stack


def find_py_spy() -> str:
    beside_python = Path(sys.executable).with_name("py-spy")
    found = str(beside_python) if beside_python.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is not installed (.venv/bin/pip install py-spy)")
    return found


@contextmanager
def recording(pid: int, output: Path, rate_hz: int, native: bool) -> Iterator[None]:
    """py-spy samples `pid` for the duration of the block, writing collapsed stacks to `output`.

    Python frames only are sampled without pausing the process; `native` (C frames too) pauses it per sample.
    """
    argv = [find_py_spy(), "record", "--pid", str(pid), "--rate", str(rate_hz), "--format", "raw",
            "--output", str(output), "--native" if native else "--nonblocking"]
    log_path = output.with_name(output.name + ".log")
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield
    finally:
        popen.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        try:
            popen.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait(timeout=STOP_TIMEOUT_S)
    if not output.exists():
        raise RuntimeError(f"py-spy wrote no profile:\n{log_path.read_text(errors='replace')[-2000:]}")


def read_collapsed(path: Path) -> list[tuple[list[str], int]]:
    """(frames outermost first, sample count) per line of py-spy's raw output, frames without line numbers."""
    stacks: list[tuple[list[str], int]] = []
    for line in path.read_text().splitlines():
        frames, _, count = line.rpartition(" ")
        if frames and count.isdigit():
            stacks.append(([LINE_NUMBER.sub(")", frame) for frame in frames.split(";")], int(count)))
    return stacks


def by_function(stacks: list[tuple[list[str], int]]) -> list[FunctionSamples]:
    """Every function's own and inclusive samples, most own samples first."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for frames, count in stacks:
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return sorted((FunctionSamples(name, own[name], total) for name, total in inclusive.items()),
                  key=lambda row: (-row.own, -row.inclusive))
