"""Process helpers for tests. The building blocks live in the package (the demo and benchmarks share them);
servers under test get an explicit environment here: the caller's, minus every `KVGATE_*` and `VLLM_*`
variable, plus what the test passes. A developer's `KVGATE_REDIS_URL` (or any other setting) therefore never
changes what a test runs against."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

from gateway.devtools import localproc
from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, wait_until_ready

__all__ = ["ServerProcess", "clean_environment", "free_port", "free_port_pair", "kvgate_command", "run_server",
           "upstream_module", "wait_until_ready"]

CALLER_PREFIXES = ("KVGATE_", "VLLM_")


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without product or vLLM settings, then `extra`."""
    return localproc.child_environment(extra, CALLER_PREFIXES)


run_server = partial(localproc.run_server, drop_prefixes=CALLER_PREFIXES)
"""`localproc.run_server(argv, port, log_path, env, ready_path)` with `clean_environment(env)` as the environment."""


@contextmanager
def upstream_module(module: str, log_path: Path, *args: str) -> Iterator[ServerProcess]:
    """One of the tests' own upstreams (`python -m tests.<name> --port P ...`, answering `GET /health`), until the
    block exits."""
    port = free_port()
    argv = [sys.executable, "-m", module, "--port", str(port), *args]
    with run_server(argv, port, log_path, ready_path="/health") as upstream:
        yield upstream
