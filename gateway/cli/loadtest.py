"""`kvgate loadtest [SCENARIO]`: the offload A/B protocol through the gateway (gateway.devtools.loadtest)."""

from __future__ import annotations

from gateway.devtools.loadtest.args import add_arguments
from gateway.devtools.loadtest.cli import run

__all__ = ["add_arguments", "run"]
