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
    ledger_rows = [line.split() for line in out.splitlines() if re.match(r"^(acme|globex|initech)\s+(CPU|GPU)\s", line)]
    stored_gpu = {row[0]: int(row[2]) for row in ledger_rows if row[1] == "GPU"}
    assert set(stored_gpu) == {"acme", "globex", "initech"} and all(n > 0 for n in stored_gpu.values())
    assert "every process it started has stopped" in out
