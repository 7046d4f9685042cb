"""Owned background tasks: every task is named, referenced until done, and awaited on close."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import structlog

log: structlog.typing.FilteringBoundLogger = structlog.get_logger(__name__)


class TaskSupervisor:
    """Holds strong references to its tasks (the loop keeps only weak ones) and reaps them on close."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)
        task.add_done_callback(self._reap)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def _reap(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background_task_failed", task=task.get_name(), error=repr(task.exception()))

    async def drain(self) -> None:
        """Wait for running tasks to finish on their own."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Cancel every task and wait until all have ended."""
        await cancel_and_wait(list(self._tasks))
        await self.drain()


# A library may swallow a cancellation (redis-py does when it is cancelled mid-command, to keep its connection
# usable) and the task then carries on; so cancellation is repeated until the task really ends.
CANCEL_ROUND_S = 0.5


async def cancel_and_wait(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel `tasks`, again every CANCEL_ROUND_S while any is still running, until all have ended."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=CANCEL_ROUND_S)
