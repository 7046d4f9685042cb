"""An aiohttp application served on 127.0.0.1 for the length of a block: a real socket for the unit tests that
need a peer (an upstream, a gateway's admin route), without a process of its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """The app's base URL on a free loopback port; the server is cleaned up when the block exits."""
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
