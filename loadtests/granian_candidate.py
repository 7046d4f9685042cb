"""kvgate's own ASGI app served by granian (Rust, hyper) instead of uvicorn: a candidate measured, not shipped.

`python -m loadtests.proxy_overhead --granian` runs it as one more proxy on the proxy core, in the same run as
kvgate on uvicorn, nginx and the Rust router, so the server's share of the relay's cost is measured rather than
argued. It needs granian where the benchmark runs (`.venv/bin/pip install -e '.[compare]'`).

The same settings (`KVGATE_*` from the environment), logging and app as `kvgate serve`; granian with one worker
process, one runtime thread (single-threaded runtime) and uvloop, HTTP/1.1 only, no websockets. What it does not
have is kvgate's uvicorn protocol subclass (gateway/limits/connections.py): its own head limits apply instead.
"""

from __future__ import annotations

import importlib.util
import sys

from gateway.http.app import GatewayApp
from gateway.log import configure_logging
from gateway.settings import Settings

APP = "loadtests.granian_candidate:app"


def available() -> bool:
    return importlib.util.find_spec("granian") is not None


def granian_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", str(port),
            "--workers", "1", "--runtime-threads", "1", "--runtime-mode", "st", "--loop", "uvloop", "--http", "1",
            "--no-ws", "--log-level", "warning", APP]


def create_app() -> GatewayApp:
    settings = Settings()
    configure_logging(settings.log_format, settings.log_level)
    return GatewayApp(settings)


def __getattr__(name: str) -> GatewayApp:
    """granian imports `app` from this module; it is built then, from the environment, not on every import."""
    if name == "app":
        return create_app()
    raise AttributeError(name)
