"""`kvgate serve`: settings → logging → uvicorn serving the gateway app."""

from __future__ import annotations

import os
import resource
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError

from gateway.http.app import GatewayApp
from gateway.limits.connections import ConnectionLimits, guarded_protocol
from gateway.log import configure_logging, get_logger
from gateway.policy.loader import PolicyLoadError, load_policy_set
from gateway.settings import SaltSecretError, Settings, salt_secret_bytes

STARTUP_FAILED = 3


def run_gateway(overrides: dict[str, Any]) -> int:
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
    configure_logging(settings.log_format, settings.log_level)
    app = GatewayApp(settings)
    limits = ConnectionLimits(settings.max_header_bytes, settings.header_timeout_s, settings.idle_timeout_s,
                              connection_cap(settings))
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, loop="uvloop",
        http=guarded_protocol(limits, app.metrics.connections_closed), ws="none",
        lifespan="on", access_log=False, log_config=None, log_level="warning", server_header=False,
        date_header=False, timeout_keep_alive=max(1, round(settings.idle_timeout_s)),
        proxy_headers=False,  # the gateway never reads the client address, so skip that middleware
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else STARTUP_FAILED  # e.g. a policy set below a tenant's salt-epoch floor


OPEN_FILES_TARGET = 1 << 16
FD_RESERVE = 256  # descriptors kept for logs, stores, ZMQ sockets and the listening socket


def connection_cap(settings: Settings) -> int:
    """The open-connection cap, lowered if the process may not open that many descriptors.

    Raises the soft descriptor limit to the hard one first: every client and upstream connection is a
    descriptor, and running out of them makes accept() fail for everyone.
    """
    soft = raise_open_files_limit()
    available = soft - settings.upstream_connections - FD_RESERVE
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
