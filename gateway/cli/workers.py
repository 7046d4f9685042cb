"""`kvgate serve --workers N`: a supervising parent and N worker processes serving one port.

The parent binds the listening socket once and hands the same socket to every worker (each runs its own
uvicorn server and event loop on it): the port is bound (and `--port 0` resolved) before any worker starts,
while a worker is down or busy the others take every new connection (the kernel wakes idle workers, and the
first to accept wins), the replacement inherits the very socket, and no other process can join the port.
Its weakness is balance: which worker wins is a race, so a burst of long-lived keep-alive connections can land
unevenly. `KVGATE_WORKERS_LISTEN=reuseport` instead binds one SO_REUSEPORT socket per worker (still in the
parent, which keeps them open): the kernel spreads connections by a hash of their addresses, evenly on
average, but blindly, and the connections hashed to a worker that is down wait in its queue until its
replacement starts.

The parent also
- gives worker 0 a private Unix socket too (gateway/http/workers.py: the ingesting worker);
- restarts a worker that exits, with the same index (so the ingesting worker is replaced by an ingesting
  worker), logged as `worker_exited` / `worker_started`; the replacement counts itself in
  `kvgate_worker_restarts_total`; repeated quick failures back off up to RESTART_BACKOFF_MAX_S;
- passes SIGHUP (a policy reload) on to every worker;
- on SIGTERM or SIGINT stops every worker gracefully (each drains its connections) and exits 0, or 1 if a
  worker ended badly; if a worker cannot start in the first place, stops the others and exits non-zero;
- keeps the workers' metric files (prometheus_client multiprocess mode) in a directory of its own, removed at
  exit, so a scrape of any worker sums every worker's counters.

A worker runs this module as a program (`python -m gateway.cli.workers ...`), started only by the parent.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from gateway.log import get_logger
from gateway.settings import Settings

log = get_logger(__name__)
STARTUP_FAILED = 3
LISTEN_BACKLOG = 2048
RESTART_BACKOFF_S = 0.5  # after a worker that lived less than STABLE_AFTER_S; doubles per quick failure
RESTART_BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 30.0
SUPERVISE_TICK_S = 1.0  # the parent also wakes on every signal, so this only bounds restart timing
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"
READY = b"R"


@dataclass
class WorkerSlot:
    index: int
    popen: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # the parent's end of the worker's readiness pipe, until it says ready or exits
    ready: bool = False
    started_at: float = 0.0
    quick_failures: int = 0
    restart_at: float | None = None
    restarts: int = 0


@dataclass
class Signals:
    """Signals received by the parent, handled in its loop (a handler only records them)."""

    pending: deque[int] = field(default_factory=deque)  # appended by handlers, popped by the loop: no swap race

    def record(self, signum: int, _frame: FrameType | None) -> None:
        self.pending.append(signum)

    def take(self) -> list[int]:
        taken = []
        while self.pending:
            taken.append(self.pending.popleft())
        return taken


def bind_listeners(host: str, port: int, workers: int, reuse_port: bool) -> list[socket.socket]:
    """One listening socket per worker: the same one for all, or (reuse_port) one each on the same port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    first = socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG, reuse_port=reuse_port)
    first.set_inheritable(True)
    if not reuse_port:
        return [first] * workers
    bound = first.getsockname()[1]  # `--port 0`: the port the first socket got
    others = [socket.create_server((host, bound), family=family, backlog=LISTEN_BACKLOG, reuse_port=True)
              for _ in range(workers - 1)]
    for other in others:
        other.set_inheritable(True)
    return [first, *others]


def bind_salt_socket(path: Path) -> socket.socket:
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(str(path))
    inbox.set_inheritable(True)
    return inbox


def bind_ingester_socket(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(LISTEN_BACKLOG)
    listener.set_inheritable(True)
    return listener


class Supervisor:
    def __init__(self, settings: Settings, overrides: dict[str, Any], runtime_dir: Path) -> None:
        self.settings = settings
        self.overrides = overrides
        self.runtime_dir = runtime_dir
        self.metrics_dir = runtime_dir / "metrics"
        self.metrics_dir.mkdir()
        self.ingester_path = runtime_dir / "ingester.sock"
        self.listeners = bind_listeners(settings.host, settings.port, settings.workers,
                                        settings.workers_listen == "reuseport")
        self.port: int = self.listeners[0].getsockname()[1]
        self.ingester = bind_ingester_socket(self.ingester_path)
        self.salt_path = runtime_dir / "salts.sock"
        self.salt_inbox = bind_salt_socket(self.salt_path)
        self.slots = [WorkerSlot(index) for index in range(settings.workers)]
        self.signals = Signals()
        self.stopping = False
        self.all_ready_once = False
        self.exit_status = 0  # 1 once a worker ends badly while stopping

    # -- starting workers ------------------------------------------------------------------------

    def worker_argv(self, slot: WorkerSlot, ready_write: int) -> list[str]:
        argv = [sys.executable, "-m", "gateway.cli.workers", "--index", str(slot.index),
                "--count", str(len(self.slots)), "--listen-fd", str(self.listeners[slot.index].fileno()),
                "--ready-fd", str(ready_write), "--ingester-socket", str(self.ingester_path),
                "--salt-socket", str(self.salt_path), "--metrics-dir", str(self.metrics_dir),
                "--overrides", json.dumps(self.overrides, default=str)]
        if slot.index == 0:
            argv += ["--ingester-fd", str(self.ingester.fileno()), "--salt-inbox-fd", str(self.salt_inbox.fileno())]
        if slot.restarts:
            argv.append("--replaced")
        return argv

    def spawn(self, slot: WorkerSlot) -> None:
        ready_read, ready_write = os.pipe()
        fds = [self.listeners[slot.index].fileno(), ready_write]
        if slot.index == 0:
            fds += [self.ingester.fileno(), self.salt_inbox.fileno()]
        env = {**os.environ, METRICS_ENV: str(self.metrics_dir)}
        slot.popen = subprocess.Popen(self.worker_argv(slot, ready_write), pass_fds=fds, env=env)
        os.close(ready_write)
        slot.ready_fd, slot.ready, slot.started_at, slot.restart_at = ready_read, False, time.monotonic(), None
        log.info("worker_started", worker=slot.index, pid=slot.popen.pid, restarts=slot.restarts)

    # -- the loop --------------------------------------------------------------------------------

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, self.signals.record)
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_write, False)
        signal.set_wakeup_fd(wake_write)
        log.info("workers_starting", workers=len(self.slots), host=self.settings.host, port=self.port,
                 listen=self.settings.workers_listen, runtime_dir=str(self.runtime_dir))
        for slot in self.slots:
            self.spawn(slot)
        try:
            return self._loop(wake_read)
        finally:
            signal.set_wakeup_fd(-1)
            os.close(wake_read)
            os.close(wake_write)

    def _loop(self, wake_read: int) -> int:
        while True:
            readable, _, _ = select.select([wake_read, *self._ready_fds()], [], [], self._timeout())
            if wake_read in readable:
                os.read(wake_read, 512)
            for fd in readable:
                if fd != wake_read:
                    self._readiness(fd)
            for signum in self.signals.take():
                self._on_signal(signum)
            outcome = self._reap()
            if outcome is not None:
                return outcome
            self._restart_due()

    def _ready_fds(self) -> list[int]:
        return [slot.ready_fd for slot in self.slots if slot.ready_fd is not None]

    def _timeout(self) -> float:
        due = [slot.restart_at for slot in self.slots if slot.restart_at is not None]
        if not due:
            return SUPERVISE_TICK_S
        return max(0.0, min(min(due) - time.monotonic(), SUPERVISE_TICK_S))

    def _readiness(self, fd: int) -> None:
        slot = next(slot for slot in self.slots if slot.ready_fd == fd)
        data = os.read(fd, 1)
        os.close(fd)
        slot.ready_fd = None
        if data == READY:
            slot.ready = True
            log.info("worker_ready", worker=slot.index, pid=slot.popen.pid if slot.popen else None)
            if not self.all_ready_once and all(slot.ready for slot in self.slots):
                self.all_ready_once = True
                log.info("workers_ready", workers=len(self.slots), port=self.port)

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGHUP and not self.stopping:
            log.info("workers_reload", workers=len(self.slots))
            self._signal_workers(signal.SIGHUP)
        elif signum in (signal.SIGTERM, signal.SIGINT):
            # A second one while draining is passed on as SIGINT: uvicorn then stops without waiting.
            self._signal_workers(signal.SIGINT if self.stopping else signal.SIGTERM)
            if not self.stopping:
                log.info("workers_stopping", signal=signal.Signals(signum).name)
            self.stopping = True

    def _signal_workers(self, signum: int) -> None:
        for slot in self.slots:
            if slot.popen is not None and slot.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.popen.send_signal(signum)

    def _reap(self) -> int | None:
        """Handle workers that exited; the parent's exit status once it should end."""
        failed_startup: int | None = None
        for slot in self.slots:
            if slot.popen is None or (code := slot.popen.poll()) is None:
                continue
            self._forget(slot, code)
            if self.stopping:
                continue
            if not self.all_ready_once:
                failed_startup = code or STARTUP_FAILED
                continue
            self._schedule_restart(slot)
        if failed_startup is not None:
            log.error("worker_startup_failed", exit_code=failed_startup)
            self.stopping = True
            self._signal_workers(signal.SIGTERM)
            self._wait_all()
            return failed_startup
        if self.stopping and all(slot.popen is None for slot in self.slots):
            return self.exit_status
        return None

    def _forget(self, slot: WorkerSlot, code: int) -> None:
        from prometheus_client import multiprocess

        pid = slot.popen.pid if slot.popen is not None else 0
        log_event = log.info if self.stopping and code in (0, -signal.SIGTERM) else log.warning
        # Its live gauges leave the sums; its counters stay in them (what it served was served).
        log_event("worker_exited", worker=slot.index, pid=pid, exit_code=code, was_ready=slot.ready)
        if self.stopping and code not in (0, -signal.SIGTERM, -signal.SIGINT):
            self.exit_status = 1
        multiprocess.mark_process_dead(pid, str(self.metrics_dir))  # type: ignore[no-untyped-call]
        if slot.ready_fd is not None:
            os.close(slot.ready_fd)
            slot.ready_fd = None
        slot.popen, slot.ready = None, False

    def _schedule_restart(self, slot: WorkerSlot) -> None:
        lived = time.monotonic() - slot.started_at
        slot.quick_failures = slot.quick_failures + 1 if lived < STABLE_AFTER_S else 0
        delay = 0.0 if slot.quick_failures == 0 else min(RESTART_BACKOFF_MAX_S,
                                                           RESTART_BACKOFF_S * 2 ** (slot.quick_failures - 1))
        slot.restart_at = time.monotonic() + delay
        slot.restarts += 1
        log.warning("worker_restart_scheduled", worker=slot.index, delay_s=delay, restarts=slot.restarts)

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.restart_at is not None and slot.restart_at <= now and not self.stopping:
                self.spawn(slot)

    def _wait_all(self) -> None:
        for slot in self.slots:
            if slot.popen is not None:
                code = slot.popen.wait()
                self._forget(slot, code)

    def close(self) -> None:
        for listener in set(self.listeners):
            listener.close()
        self.ingester.close()
        self.salt_inbox.close()


def supervise(settings: Settings, overrides: dict[str, Any]) -> int:
    runtime_dir = Path(tempfile.mkdtemp(prefix="kvgate-workers-"))  # mode 0700: only this user reaches it
    try:
        supervisor = Supervisor(settings, overrides, runtime_dir)
    except OSError as error:
        log.error("listen_failed", host=settings.host, port=settings.port, error=str(error))
        shutil.rmtree(runtime_dir, ignore_errors=True)
        return 1
    try:
        return supervisor.run()
    finally:
        supervisor.close()
        shutil.rmtree(runtime_dir, ignore_errors=True)


# -- inside a worker -------------------------------------------------------------------------------------


def worker_main(argv: Sequence[str] | None = None) -> int:
    # A reload asked for before this worker can act on it must not end it (SIGHUP's default); the app's own
    # handler replaces this once it has started.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    args = _worker_parser().parse_args(argv)
    from gateway.cli.serve import serve_on_sockets

    sockets = [socket.socket(fileno=args.listen_fd)]
    if args.ingester_fd is not None:
        sockets.append(socket.socket(fileno=args.ingester_fd))
    return serve_on_sockets(json.loads(args.overrides), WorkerArgs(
        args.index, args.count, Path(args.ingester_socket), Path(args.salt_socket), args.salt_inbox_fd,
        Path(args.metrics_dir), args.replaced, args.ready_fd, os.getppid()), sockets)


@dataclass(frozen=True)
class WorkerArgs:
    index: int
    count: int
    ingester_socket: Path
    salt_socket: Path
    salt_inbox_fd: int | None
    metrics_dir: Path
    replaced: bool
    ready_fd: int
    parent_pid: int


def _worker_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate-worker", description="one worker of `kvgate serve --workers`")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--ingester-socket", required=True)
    parser.add_argument("--ingester-fd", type=int)
    parser.add_argument("--salt-socket", required=True)
    parser.add_argument("--salt-inbox-fd", type=int)
    parser.add_argument("--metrics-dir", required=True)
    parser.add_argument("--overrides", required=True)
    parser.add_argument("--replaced", action="store_true")
    return parser


if __name__ == "__main__":
    sys.exit(worker_main())
