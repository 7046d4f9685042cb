"""How a benchmark hands back its result: indented JSON on stdout and, when asked, the same in a file."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(result: object, out: Path) -> None:
    """`result` as indented JSON in `out` (its folder made first)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def print_and_write_json(result: object, out: Path | None) -> None:
    """`result` as indented JSON on stdout, and in `out` too when one is given."""
    print(json.dumps(result, indent=2))
    if out is not None:
        write_json(result, out)
