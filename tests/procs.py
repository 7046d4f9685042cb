"""Process helpers for tests. The building blocks live in the package (the demo and benchmarks share them);
servers under test get an explicit environment here: the caller's, minus every `KVGATE_*` and `VLLM_*`
variable, plus what the test passes. A developer's `KVGATE_REDIS_URL` (or any other setting) therefore never
changes what a test runs against."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from gateway.devtools import localproc
from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, wait_until_ready

__all__ = ["ServerProcess", "clean_environment", "free_port", "free_port_pair", "kvgate_command", "run_server",
           "wait_until_ready"]

CALLER_PREFIXES = ("KVGATE_", "VLLM_")


def clean_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without product or vLLM settings, then `extra`."""
    base = {name: value for name, value in os.environ.items() if not name.startswith(CALLER_PREFIXES)}
    return {**base, **(extra or {})}


@contextmanager
def run_server(
    argv: Sequence[str],
    port: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    ready_path: str = "/livez",
) -> Iterator[ServerProcess]:
    """Run `argv` (which must listen on `port`) with `clean_environment(env)` until the block exits."""
    with localproc.run_server(argv, port, log_path, clean_environment(env), ready_path, inherit=False) as server:
        yield server
