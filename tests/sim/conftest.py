"""Fixtures for the simulator's tests: real `python -m gateway.sim` processes on 127.0.0.1."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.procs import ServerProcess, free_port, run_server

StartSim = Callable[..., AbstractContextManager[ServerProcess]]


def sim_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gateway.sim", "--port", str(port), *extra]


@pytest.fixture(scope="session")
def start_sim(tmp_path_factory: pytest.TempPathFactory) -> StartSim:
    """Start a simulator with extra flags, as a context manager; it stops when the block exits."""

    def start(*extra: str) -> AbstractContextManager[ServerProcess]:
        port = free_port()
        log_path = Path(tmp_path_factory.mktemp("sim")) / f"sim-{port}.log"
        return run_server(sim_argv(port, *extra), port, log_path, ready_path="/health")

    return start


@pytest.fixture(scope="session")
def sim(start_sim: StartSim) -> Iterator[ServerProcess]:
    """A simulator with default settings, shared by the tests that use only fresh prompts."""
    with start_sim() as server:
        yield server
