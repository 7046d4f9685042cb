"""Cancel the request's own task when the client goes away, without moving the work to another task.

The relay runs inline in the request task (no extra loop hop before the first upstream byte). Under
`kvgate serve`, the server's protocol (gateway/limits/connections.py) puts a `DisconnectNotice` in the scope's
extensions and calls it when the client's connection is lost, so the guard costs no task per request (a watcher
task was about 5 % of the instructions of a one-token request: loadtests/instructions.py). Under any other ASGI
server a small watcher task listens for `http.disconnect` instead; it is owned and awaited on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType

from gateway.asgi.io import Receive, Scope, scope_extension, wait_disconnect

DISCONNECT_EXTENSION = "kvgate.disconnect"


class DisconnectNotice:
    """One per client connection: the callback to run once if the connection is lost (set by the request being
    served; requests on one connection are served one at a time)."""

    __slots__ = ("callback",)

    def __init__(self) -> None:
        self.callback: Callable[[], None] | None = None

    def connection_lost(self) -> None:
        callback, self.callback = self.callback, None
        if callback is not None:
            callback()


def disconnect_notice(scope: Scope) -> DisconnectNotice | None:
    notice = scope_extension(scope, DISCONNECT_EXTENSION, "notice")
    return notice if isinstance(notice, DisconnectNotice) else None


class DisconnectGuard:
    """`async with DisconnectGuard(receive, notice) as guard:` — the body is cancelled if the client disconnects;
    the cancellation is absorbed and `guard.disconnected` is True."""

    __slots__ = ("_notice", "_receive", "_task", "_watcher", "disconnected")

    def __init__(self, receive: Receive, notice: DisconnectNotice | None = None) -> None:
        self._receive = receive
        self._notice = notice
        self.disconnected = False
        self._task: asyncio.Task[object] | None = None
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> DisconnectGuard:
        self._task = asyncio.current_task()
        if self._notice is not None:
            self._notice.callback = self._lost
        else:
            # Owned here and awaited in __aexit__; not fire-and-forget.
            self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return self

    def _lost(self) -> None:
        self.disconnected = True
        assert self._task is not None
        self._task.cancel()

    async def _watch(self) -> None:
        await wait_disconnect(self._receive)
        self._lost()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        assert self._task is not None
        if self._notice is not None and self._notice.callback == self._lost:
            self._notice.callback = None
        try:
            if self._watcher is not None:
                self._watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._watcher
        finally:
            if self.disconnected and self._task.cancelling():
                self._task.uncancel()
        return self.disconnected and (exc_type is None or issubclass(exc_type, asyncio.CancelledError))
