"""Plain-text tables for terminal reports."""

from __future__ import annotations

from collections.abc import Sequence


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(title) for title in header], *[[cell(value) for value in row] for row in rows]]
    widths = [max(len(row[column]) for row in cells) for column in range(len(header))]
    lines = ["  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)
