"""The ledger's own long-running tasks, each kept alive: if one ever ends (an error nobody foresaw), it is
logged, counted and started again after a pause. Shutdown cancels them all and waits until they have ended."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.ledger.observe import LedgerMetrics
from gateway.log import get_logger
from gateway.tasks import TaskSupervisor, cancel_and_wait

log = get_logger(__name__)
RESTART_DELAY_S = 1.0  # before a ledger task that ended is started again

Work = Callable[[], Coroutine[Any, Any, None]]


class LedgerRunner:
    """Spawns through the gateway's `TaskSupervisor` (the only place tasks are created) and remembers what it
    spawned, so the ledger can stop its own tasks without stopping the gateway's."""

    def __init__(self, tasks: TaskSupervisor, metrics: LedgerMetrics) -> None:
        self._tasks = tasks
        self._metrics = metrics
        self.running: list[asyncio.Task[Any]] = []

    def keep_running(self, name: str, work: Work) -> asyncio.Task[Any]:
        task = self._tasks.spawn(self._supervised(name, work), name)
        self.running.append(task)
        return task

    async def _supervised(self, name: str, work: Work) -> None:
        """Run `work` for as long as the ledger lives; whatever ends it, it is counted and started again."""
        while True:
            try:
                await work()
                log.error("ledger_task_ended", task=name)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a ledger task must never stay dead: logged, counted, restarted
                log.error("ledger_task_failed", task=name, error=repr(error)[:300])
            self._metrics.task_restarted(name)
            await asyncio.sleep(RESTART_DELAY_S)

    async def stop(self) -> None:
        await cancel_and_wait(self.running)
        self.running.clear()
