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
from types import CoroutineType
from typing import Any

Step = Coroutine[Any, Any, None]


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


async def _await(awaitable: Awaitable[None]) -> None:
    await awaitable


async def _continue(coroutine: Step, waiting_on: object) -> None:
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
    except StopIteration:
        return


async def _wait_on(waiting_on: asyncio.Future[object] | None) -> None:
    if waiting_on is None:  # a bare yield (asyncio.sleep(0)): one turn of the loop
        await asyncio.sleep(0)
        return
    # As asyncio's Task does with a future it is handed: it is now ours to wait on (awaiting a future still
    # marked as blocking raises "await wasn't used with future").
    waiting_on._asyncio_future_blocking = False
    await waiting_on
