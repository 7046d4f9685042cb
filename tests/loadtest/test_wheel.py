"""`kvgate loadtest` from a built wheel (a non-editable install): no source checkout, no sys.path changes.

The wheel is built from this checkout and installed into a folder of its own; the command runs from an empty
working directory with only that folder on PYTHONPATH, so the checkout's own `gateway/` cannot be imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _install_wheel(tmp_path: Path) -> Path:
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=240)
    wheel = next(wheels.glob("kvgate-*.whl"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
                   check=True, capture_output=True, timeout=240)
    return site


def test_loadtest_runs_from_a_wheel_with_its_bundled_scenario(tmp_path: Path) -> None:
    site = _install_wheel(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    where = subprocess.run([sys.executable, "-c", "import gateway; print(gateway.__file__)"], cwd=work, env=env,
                           check=True, capture_output=True, text=True, timeout=60)
    assert where.stdout.strip().startswith(str(site))
    written = subprocess.run(
        [sys.executable, "-m", "gateway", "loadtest", "--write-policies", str(work / "policies"),
         "--upstream", "offload=http://127.0.0.1:9", "--upstream", "control=http://127.0.0.1:9"],
        cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert written.returncode == 0, written.stderr
    access = json.loads((work / "policies" / "keys.json").read_text())
    assert set(access["tenants"]) == {"acme", "globex", "initech"}  # the tenants of the bundled scenario
    assert (work / "policies" / "gateway.yaml").is_file()
