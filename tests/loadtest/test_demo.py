"""The README's first command: `kvgate demo` runs the whole product on simulators and stops what it started."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.procs import kvgate_command


def test_the_demo_runs_every_part_and_reports_it(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run(kvgate_command("demo"), capture_output=True, text=True, timeout=240, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"80 streamed requests through the gateway \(0 failed\)", out)
    for section in ("Traffic per tenant and pool", "TTFT p50 by phase and arm", "block-lifecycle ledger",
                    "Shadow A/B"):
        assert section in out
    ledger_rows = _ledger_rows(out)
    stored_gpu = {row["tenant"]: int(row["stored"]) for row in ledger_rows if row["medium"] == "GPU"}
    assert set(stored_gpu) == {"acme", "globex", "initech"} and all(n > 0 for n in stored_gpu.values())
    for row in ledger_rows:  # what was not observed reads "unknown", never 0
        assert (row["lifetime p50 s"] == "unknown") == (row["removed"] == "0"), row
        if row["resident"] != "0":
            assert float(row["oldest s"]) >= 0.0, row
    assert "every process it started has stopped" in out


def _ledger_rows(out: str) -> list[dict[str, str]]:
    """The ledger table's rows by column title: columns are cut where the dashed line under the header says."""
    lines = out.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("tenant ") and "oldest s" in line)
    spans = [match.span() for match in re.finditer(r"-+", lines[start + 1])]
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append({lines[start][a:b].strip(): line[a:b].strip() for a, b in spans})
    return rows
