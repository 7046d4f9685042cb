"""Owned background tasks end on close even when something inside swallows a cancellation (redis-py does when
it is cancelled mid-command), and a failed task is logged by name."""

from __future__ import annotations

import asyncio

from gateway.tasks import TaskSupervisor


async def _swallows_the_first_cancellation(rounds: list[int]) -> None:
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            rounds.append(1)
            if len(rounds) == 1:
                continue  # what a library that cleans up a connection and carries on looks like
            raise


def test_close_ends_a_task_that_swallowed_one_cancellation() -> None:
    async def run() -> list[int]:
        supervisor = TaskSupervisor("t")
        rounds: list[int] = []
        supervisor.spawn(_swallows_the_first_cancellation(rounds), "stubborn")
        await asyncio.sleep(0)  # let it start
        async with asyncio.timeout(30):  # bounds the test only; close itself has no deadline
            await supervisor.close()
        assert len(supervisor) == 0
        return rounds

    assert asyncio.run(run()) == [1, 1]
