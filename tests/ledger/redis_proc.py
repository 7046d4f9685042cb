"""A real `redis-server` on a free loopback port, started and stopped by PID."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import redis

from tests.procs import free_port

READY_TIMEOUT_S = 20.0


class RedisProcess:
    def __init__(self, workdir: Path, persistent: bool = False, port: int | None = None) -> None:
        self.workdir = workdir
        self.persistent = persistent
        self.port = port or free_port()
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        persistence = ["--appendonly", "yes", "--appendfsync", "always"] if self.persistent else ["--appendonly", "no"]
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                *persistence, "--dir", str(self.workdir)]
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "redis.log").open("ab")
        self.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        client = redis.Redis(port=self.port, socket_timeout=1)
        while time.monotonic() < deadline:
            assert self.popen is not None and self.popen.poll() is None, "redis-server exited"
            try:
                if client.ping():
                    client.close()
                    return
            except redis.exceptions.RedisError:
                time.sleep(0.02)  # polling backoff while it binds, not synchronisation
        raise TimeoutError("redis-server did not answer PING")

    def kill(self) -> None:
        """SIGKILL: no chance to save or say goodbye."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
