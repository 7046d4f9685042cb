"""Progress while the protocol runs: a one-line bar on a terminal, plain lines (one per phase) otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO

BAR_WIDTH = 28


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None, force_plain: bool = False) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() and not force_plain
        self.started = time.monotonic()
        self._last_line = 0

    def step(self, label: str) -> None:
        """One unit of work finished (a request, a restart)."""
        self.done = min(self.done + 1, self.total)
        if self.tty:
            self._draw(label)

    def note(self, message: str) -> None:
        """A milestone: a phase finished, a restart happened. Always printed on its own line."""
        if self.tty:
            self._clear()
        elapsed = time.monotonic() - self.started
        self.stream.write(f"[{elapsed:6.1f}s {self.done}/{self.total}] {message}\n")
        self.stream.flush()
        if self.tty:
            self._draw("")

    def close(self) -> None:
        if self.tty:
            self._clear()

    def _draw(self, label: str) -> None:
        filled = int(BAR_WIDTH * self.done / self.total)
        line = f"\r[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.total} {label}"[:120]
        padding = max(self._last_line - len(line), 0)
        self.stream.write(line + " " * padding)
        self.stream.flush()
        self._last_line = len(line)

    def _clear(self) -> None:
        self.stream.write("\r" + " " * self._last_line + "\r")
        self._last_line = 0
