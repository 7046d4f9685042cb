"""The simulator process: exit statuses of `python -m gateway.sim`."""

from __future__ import annotations

import subprocess

from tests.procs import free_port
from tests.sim.conftest import StartSim, sim_argv


def test_sigterm_stops_with_status_zero(start_sim: StartSim) -> None:
    with start_sim() as server:
        pass
    assert server.popen.returncode == 0


def test_invalid_flags_exit_two() -> None:
    invalid = subprocess.run(sim_argv(free_port(), "--block-size", "0"), capture_output=True, timeout=60)
    assert invalid.returncode == 2 and b"block_size must be positive" in invalid.stderr


def test_unusable_event_endpoint_fails_startup() -> None:
    failed = subprocess.run(sim_argv(free_port(), "--kv-events-endpoint", "tcp://*:notaport"),
                            capture_output=True, timeout=60)
    assert failed.returncode == 1 and b"KV event publisher failed to start" in failed.stderr
