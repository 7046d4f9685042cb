"""No tracked text file carries an unresolved merge: a conflict's opening or closing marker line.

A README once shipped with both sides of a conflict in its benchmarks list; the docs are the product's reference,
so a half-merged file is a defect a test can catch."""

from __future__ import annotations

import re

import pytest

from tests.unit.test_self_contained import ROOT, tracked_files

# Built from parts, so this file does not match its own pattern.
MARKER = re.compile("^(?:" + "<" * 7 + "|" + ">" * 7 + r")(?: |$)", re.MULTILINE)


def conflict_lines(text: str) -> list[int]:
    return [text.count("\n", 0, match.start()) + 1 for match in MARKER.finditer(text)]


def test_no_tracked_file_holds_conflict_markers() -> None:
    found = []
    for name in tracked_files():
        path = ROOT / name
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary
        found += [f"{name}:{line}" for line in conflict_lines(data.decode("utf-8", errors="replace"))]
    assert not found, "unresolved merge conflicts in: " + ", ".join(found)


@pytest.mark.parametrize(("text", "lines"), [
    ("a\n" + "<" * 7 + " HEAD\nb\n" + "=" * 7 + "\nc\n" + ">" * 7 + " wt/relay\n", [2, 6]),
    ("a <<<<<<< b\n" + "<" * 6 + " six\n" + "<" * 8 + "\n", []),  # mid-line, six or eight are no markers
])
def test_the_check_itself(text: str, lines: list[int]) -> None:
    assert conflict_lines(text) == lines
