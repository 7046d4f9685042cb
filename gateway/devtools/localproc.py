"""Start local server processes on loopback (demo, tests, benchmarks) and stop them by PID.

Readiness is awaited by polling a condition (an HTTP answer), never by fixed sleeps.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def free_port_pair() -> int:
    """A free port whose successor is free too: vLLM's KV-event replay endpoint is the PUB port + 1."""
    while True:
        port = free_port()
        if port < 65535 and _is_free(port + 1):
            return port


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@dataclass
class ServerProcess:
    """A child process serving HTTP on 127.0.0.1:port."""

    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def send_signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=timeout_s)
        return self.popen.returncode


def wait_until_ready(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float = STARTUP_TIMEOUT_S
) -> None:
    """Poll `url` until any HTTP answer arrives; fail fast if the process dies."""
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            httpx.get(url, timeout=1.0)
            return
        except httpx.TransportError:
            time.sleep(delay)  # polling backoff while the server binds, not synchronisation
            delay = min(delay * 2, 0.25)
    raise TimeoutError(f"{url} not ready after {timeout_s}s:\n{log_path.read_text()[-4000:]}")


def kvgate_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "gateway", *args]


def child_environment(env: Mapping[str, str] | None = None, drop_prefixes: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without the variables whose names start with one of `drop_prefixes`, then `env`."""
    base = {name: value for name, value in os.environ.items() if not name.startswith(drop_prefixes)}
    return {**base, **(env or {})}


@contextmanager
def run_server(
    argv: Sequence[str],
    port: int,
    log_path: Path,
    env: dict[str, str] | None = None,
    ready_path: str = "/livez",
    drop_prefixes: tuple[str, ...] = (),
) -> Iterator[ServerProcess]:
    """Run `argv` (which must listen on `port`) until the block exits, with `child_environment(env, drop_prefixes)`:
    the caller's environment less the variables named by `drop_prefixes`, plus `env`."""
    with log_path.open("wb") as log:
        popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_environment(env, drop_prefixes))
    server = ServerProcess(popen=popen, port=port, log_path=log_path)
    try:
        wait_until_ready(popen, f"{server.url}{ready_path}", log_path)
        yield server
    finally:
        server.stop()
