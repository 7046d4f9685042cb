"""An aiohttp application served on 127.0.0.1 for the length of a block: a real socket for the unit tests that
need a peer (an upstream, a gateway's admin route), without a process of its own."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


@contextmanager
def serving_in_thread(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A standard-library HTTP handler served on a free loopback port from a thread, for code under test that
    makes blocking calls (the CLI's httpx); shut down and joined when the block exits."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
