"""vLLM Router (the Rust `vllm-router` from PyPI) as a second reference proxy on the proxy core.

It is installed into its own virtual environment, not kvgate's: its wheel depends on fastapi with starlette >= 1,
which kvgate's starlette pin excludes. One command sets it up (the benchmark finds it there, or on PATH):

    python3 -m venv .venv-bench && .venv-bench/bin/pip install vllm-router==0.1.17

Run in front of the same fast upstream as kvgate and nginx: one worker URL, round-robin, retries and circuit
breaker off (one upstream: nothing to fail over to), info logging.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gateway.devtools.localproc import ServerProcess, free_port, run_server

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV_BINARY = REPO_ROOT / ".venv-bench" / "bin" / "vllm-router"
VERSION = "0.1.17"


def router_binary(explicit: str | None = None) -> str | None:
    """The `vllm-router` executable: the one given, the benchmark venv's, or one on PATH (None: not installed)."""
    if explicit:
        return explicit
    if BENCH_VENV_BINARY.exists():
        return str(BENCH_VENV_BINARY)
    return shutil.which("vllm-router")


def router_argv(binary: str, port: int, metrics_port: int, upstream_url: str) -> list[str]:
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", upstream_url,
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),  # its default port may be taken
            "--policy", "round_robin", "--disable-retries", "--disable-circuit-breaker", "--log-level", "info",
            "--health-check-interval-secs", "3600"]


@contextmanager
def run_router(binary: str, work: Path, upstream_url: str) -> Iterator[ServerProcess]:
    """The router until the block exits; stopped by its PID."""
    work.mkdir(parents=True)
    port = free_port()
    argv = router_argv(binary, port, free_port(), upstream_url)
    with run_server(argv, port, work / "router.log", ready_path="/health", env={"RUST_LOG": "warn"}) as server:
        yield server
