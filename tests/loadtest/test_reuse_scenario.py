"""`kvgate loadtest` on a `kind: reuse` file: a self-started simulator and gateway per tier size, the plan's
prediction from GET /admin/plan beside the server's counters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

SCENARIO = Path(__file__).resolve().parents[2] / "loadtests" / "scenarios" / "plan-sim.yaml"


def test_reuse_scenario_reports_prediction_and_measurement(tmp_path: Path) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    scenario["workload"]["requests"] = 60
    scenario["cpu_bytes_to_use"] = [3_000_000_000]
    path = tmp_path / "reuse.yaml"
    path.write_text(yaml.safe_dump(scenario))
    done = subprocess.run([sys.executable, "-m", "gateway", "loadtest", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    (run,) = report["runs"]
    measured = run["measured"]
    assert measured["requests"] == 60 and measured["failures"] == 0
    assert measured["cpu_share"] > 0.05  # the workload does reach the CPU tier at this size
    comparison = run["comparison"]
    assert comparison["match"] is True, comparison
    assert comparison["kv_bytes_per_token"] == comparison["server_kv_bytes_per_token"] == 147456
    assert run["plan"]["trace"]["records"] == 60
    assert "| 3,000,000,000 |" in (tmp_path / "out" / "report.md").read_text()
