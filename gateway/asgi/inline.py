"""Run a coroutine inside a callback until it first has to wait, and hand the rest to a task.

The relay sends each upstream read to the client from the upstream connection's read callback
(`UpstreamConnection.pump`): the server's `send` almost never waits (it writes to the client's transport and
returns), so stepping its coroutine in place spares the request task a wake-up per streamed read (with it, the
relay used 9-14 % less CPU per streamed request at c=32 on the 16-core host: docs/proxy-costs.md). When `send`
does wait (the client's transport is over its high-water mark), what is left of it is returned as a coroutine for
the request task to await, exactly as an `await send(...)` would have continued.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from types import CoroutineType
from typing import Any, Generic, TypeVar

T = TypeVar("T")
Step = Coroutine[Any, Any, None]


@dataclass(frozen=True, slots=True)
class Ready(Generic[T]):
    """What a coroutine run in place returned without waiting."""

    value: T


def run_until_blocked(awaitable: Awaitable[None]) -> Step | None:
    """Run `awaitable` (a coroutine) here until it returns (None) or first waits (the rest of it, to be awaited
    in a task). An exception it raises before waiting is raised here. Any other awaitable is left whole to the
    task."""
    if not isinstance(awaitable, CoroutineType):  # the concrete type: an ABC check costs a call per event
        return _await(awaitable)
    try:
        waiting_on = awaitable.send(None)
    except StopIteration:
        return None
    return _continue(awaitable, waiting_on)


def run_for_result(coroutine: Coroutine[Any, Any, T]) -> Ready[T] | Coroutine[Any, Any, T]:
    """Run `coroutine` here until it returns (its value, as `Ready`) or first waits (the rest of it, to be awaited
    in a task, which returns the value). An exception it raises before waiting is raised here."""
    try:
        waiting_on = coroutine.send(None)
    except StopIteration as done:
        return Ready(done.value)
    return _continue(coroutine, waiting_on)


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


async def _continue(coroutine: Coroutine[Any, Any, T], waiting_on: object) -> T:
    """Drive `coroutine` from the awaiting task as asyncio's Task would: wait on what it yielded, then resume it;
    an exception the wait raises (a cancellation above all) is thrown in where it waits."""
    try:
        while True:
            if waiting_on is not None and not asyncio.isfuture(waiting_on):
                coroutine.close()
                raise RuntimeError(f"a coroutine run inline yielded {type(waiting_on).__name__}, not an asyncio "
                                   "future")
            try:
                await _wait_on(waiting_on)
            except BaseException as error:  # thrown into the coroutine, which decides
                waiting_on = coroutine.throw(error)
            else:
                waiting_on = coroutine.send(None)
    except StopIteration as done:
        result: T = done.value
        return result


async def _wait_on(waiting_on: asyncio.Future[object] | None) -> None:
    if waiting_on is None:  # a bare yield (asyncio.sleep(0)): one turn of the loop
        await asyncio.sleep(0)
        return
    # As asyncio's Task does with a future it is handed: it is now ours to wait on (awaiting a future still
    # marked as blocking raises "await wasn't used with future").
    waiting_on._asyncio_future_blocking = False
    await waiting_on
