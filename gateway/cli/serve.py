"""`kvgate serve`: settings → logging → uvicorn serving the gateway app, in this process or, with
`--workers N` (KVGATE_WORKERS), in N worker processes under a supervising parent (gateway/cli/workers.py)."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import sys
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import structlog
import uvicorn
from pydantic import ValidationError

from gateway.http.app import GatewayApp
from gateway.http.workers import WorkerRole
from gateway.limits.connections import ConnectionLimits, guarded_protocol
from gateway.log import configure_logging, get_logger
from gateway.policy.loader import PolicyLoadError, load_policy_set
from gateway.settings import SaltSecretError, Settings, salt_secret_bytes

if TYPE_CHECKING:
    from gateway.cli.workers import WorkerArgs

STARTUP_FAILED = 3


def run_gateway(overrides: dict[str, Any]) -> int:
    settings = checked_settings(overrides)
    if isinstance(settings, int):
        return settings
    configure_logging(settings.log_format, settings.log_level)
    if settings.workers > 1:
        from gateway.cli.workers import supervise

        if settings.redis_url is None:
            get_logger(__name__).warning(
                "workers_without_redis", workers=settings.workers,
                effect="requests_per_minute limits and offload admission are kept per worker")
        return supervise(settings, overrides)
    app = GatewayApp(settings)
    config = serving_config(app, settings, host=settings.host, port=settings.port)
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else STARTUP_FAILED  # e.g. a policy set below a tenant's salt-epoch floor


def checked_settings(overrides: dict[str, Any]) -> Settings | int:
    """The settings, or the exit status of a refusal (its reason printed): checked before anything starts."""
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        print(f"invalid settings: {error}", file=sys.stderr)
        return 2
    try:
        salt_secret_bytes(settings)
    except SaltSecretError as error:
        print(str(error), file=sys.stderr)
        return 2
    try:
        load_policy_set(settings.policies, os.environ)
    except PolicyLoadError as error:
        print("\n".join(error.problems), file=sys.stderr)
        return 1
    return settings


def serving_config(app: GatewayApp, settings: Settings, **where: Any) -> uvicorn.Config:
    """uvicorn's configuration, the same in one process and in every worker: each enforces the connection
    limits (gateway/limits/connections.py) on the connections it accepted."""
    limits = ConnectionLimits(settings.max_header_bytes, settings.header_timeout_s, settings.idle_timeout_s,
                              connection_cap(settings))
    return uvicorn.Config(
        app, loop="uvloop", **where,
        http=guarded_protocol(limits, app.metrics.connections_closed), ws="none",
        lifespan="on", access_log=False, log_config=None, log_level="warning", server_header=False,
        date_header=False, timeout_keep_alive=max(1, round(settings.idle_timeout_s)),
        proxy_headers=False,  # the gateway never reads the client address, so skip that middleware
    )


def serve_on_sockets(overrides: dict[str, Any], worker: WorkerArgs, sockets: list[socket.socket]) -> int:
    """One worker of `serve --workers N`: the gateway app on the sockets the parent bound."""
    settings = Settings(**overrides)
    configure_logging(settings.log_format, settings.log_level)
    structlog.contextvars.bind_contextvars(worker=worker.index)  # every log line says which worker wrote it
    role = WorkerRole(worker.index, worker.count, worker.ingester_socket, worker.salt_socket, worker.replaced,
                      worker.salt_inbox_fd, worker.parent_pid)
    app = GatewayApp(settings, role=role, metrics_dir=worker.metrics_dir)
    server = WorkerServer(serving_config(app, settings), worker.ready_fd, worker.parent_pid)
    server.run(sockets=sockets)
    return 0 if server.started else STARTUP_FAILED


class WorkerServer(uvicorn.Server):
    """uvicorn's server, telling the parent once it serves, and stopping if the parent is gone."""

    def __init__(self, config: uvicorn.Config, ready_fd: int, parent_pid: int) -> None:
        super().__init__(config)
        self.ready_fd = ready_fd
        self.parent_pid = parent_pid

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            if self.started:
                os.write(self.ready_fd, b"R")
            os.close(self.ready_fd)

    async def on_tick(self, counter: int) -> bool:
        if os.getppid() != self.parent_pid:  # the supervisor died (even by SIGKILL): drain and end, not orphaned
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """SIGTERM/SIGINT start a graceful stop, and the worker then exits with its own status (uvicorn's
        version raises the signal again at the end, so the parent would see every drained worker as killed)."""
        import signal

        handled = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


OPEN_FILES_TARGET = 1 << 16
FD_RESERVE = 256  # descriptors kept for logs, stores, ZMQ sockets and the listening socket
UPSTREAM_POOLS = 2  # the relay's and the shadows' (gateway/http/wiring.py), each up to upstream_connections


def connection_cap(settings: Settings) -> int:
    """The open-connection cap, lowered if the process may not open that many descriptors.

    Raises the soft descriptor limit to the hard one first: every client and upstream connection is a
    descriptor, and running out of them makes accept() fail for everyone.
    """
    soft = raise_open_files_limit()
    available = soft - UPSTREAM_POOLS * settings.upstream_connections - FD_RESERVE
    cap = max(1, min(settings.max_connections, available))
    if cap < settings.max_connections:
        get_logger(__name__).warning("connection_cap_lowered", requested=settings.max_connections, cap=cap,
                                     open_files_limit=soft)
    return cap


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit (capped); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, OPEN_FILES_TARGET) if hard != resource.RLIM_INFINITY else OPEN_FILES_TARGET
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError):
            return soft
        return target
    return soft
