"""Cancel the request's own task when the client goes away, without moving the work to another task.

The relay runs inline in the request task (no extra loop hop before the first upstream byte); a small
watcher task listens for `http.disconnect` and cancels it. The watcher is owned and awaited on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType

from gateway.asgi.io import Receive, wait_disconnect


class DisconnectGuard:
    """`async with DisconnectGuard(receive) as guard:` — the body is cancelled if the client disconnects;
    the cancellation is absorbed and `guard.disconnected` is True."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.disconnected = False
        self._task: asyncio.Task[object] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectGuard:
        self._task = asyncio.current_task()
        # Owned here and awaited in __aexit__; not fire-and-forget.
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    async def _watch(self) -> None:
        await wait_disconnect(self._receive)
        self.disconnected = True
        assert self._task is not None
        self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._watcher is not None and self._task is not None
        self._watcher.cancel()
        try:
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        finally:
            if self.disconnected and self._task.cancelling():
                self._task.uncancel()
        return self.disconnected and (exc_type is None or issubclass(exc_type, asyncio.CancelledError))
