"""`kvgate serve`: settings → logging → uvicorn serving the gateway app."""

from __future__ import annotations

import os
import sys
from typing import Any

import uvicorn
from pydantic import ValidationError

from gateway.http.app import GatewayApp
from gateway.log import configure_logging
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
    config = uvicorn.Config(
        GatewayApp(settings), host=settings.host, port=settings.port, loop="uvloop", http="httptools",
        lifespan="on", access_log=False, log_level="warning", server_header=False, date_header=False,
        proxy_headers=False,  # the gateway never reads the client address, so skip that middleware
    )
    server = uvicorn.Server(config)
    server.run()
    return 0 if server.started else STARTUP_FAILED  # e.g. a policy set below a tenant's salt-epoch floor
