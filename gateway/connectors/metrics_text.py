"""Sums of samples read from another server's /metrics page (vLLM's, an LMCache server's). Pure.

Line by line, without a full exposition parser: a page from a server of another version may hold lines such a
parser refuses, and one unreadable sample must not hide the others. A sample line is `name[{labels}] value
[timestamp]`; comments and other families are passed over, as is a sample whose value is not a number.
"""

from __future__ import annotations

from collections.abc import Collection


def sum_samples(text: str, names: Collection[str]) -> float | None:
    """Sum of every sample of the families `names` on the page; None when it has none of them (0 is a reading)."""
    total: float | None = None
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in names:
            continue
        # the value is the first field after the labels; an optional timestamp may follow it
        _, brace, after = line.rpartition("}")
        fields = (after if brace else line[len(name):]).split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        total = value if total is None else total + value
    return total
