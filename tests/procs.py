"""Process helpers for tests (they live in the package so the demo and benchmarks share them)."""

from gateway.devtools.localproc import (
    ServerProcess,
    free_port,
    free_port_pair,
    kvgate_command,
    run_server,
    wait_until_ready,
)

__all__ = ["ServerProcess", "free_port", "free_port_pair", "kvgate_command", "run_server", "wait_until_ready"]
