"""Running a coroutine inline until it first waits (gateway/asgi/inline.py), on a real event loop: what runs in
place, what the awaiting task finishes, and how errors and cancellation reach the coroutine where it waits."""

from __future__ import annotations

import asyncio
import types
from collections.abc import Generator
from typing import Any

import pytest

from gateway.asgi.inline import Ready, run_for_result, run_until_blocked


def test_a_coroutine_that_never_waits_runs_to_its_end_in_place() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    async def main() -> None:
        assert run_until_blocked(quick()) is None
        assert done == ["ran"]  # before any turn of the loop

    asyncio.run(main())


def test_a_coroutine_that_waits_leaves_its_rest_to_the_task_which_finishes_it_in_order() -> None:
    """Without clearing the future's blocking mark, awaiting the rest raises "await wasn't used with future"."""
    steps: list[str] = []

    async def two_halves(ready: asyncio.Event) -> None:
        steps.append("before")
        await ready.wait()
        steps.append("after")

    async def main() -> None:
        ready = asyncio.Event()
        loop = asyncio.get_running_loop()
        rests: list[Any] = []
        loop.call_soon(lambda: rests.append(run_until_blocked(two_halves(ready))))  # from a callback, as the relay
        while not rests:
            await asyncio.sleep(0)
        assert steps == ["before"] and rests[0] is not None
        loop.call_soon(ready.set)
        await rests[0]
        assert steps == ["before", "after"]

    asyncio.run(main())


def test_errors_raise_in_place_before_the_first_wait_and_from_the_rest_after_it() -> None:
    class Refused(Exception):
        pass

    async def refuses_at_once() -> None:
        raise Refused

    async def refuses_later(ready: asyncio.Event) -> None:
        await ready.wait()
        raise Refused

    async def main() -> None:
        with pytest.raises(Refused):
            run_until_blocked(refuses_at_once())
        ready = asyncio.Event()
        rest = run_until_blocked(refuses_later(ready))
        assert rest is not None
        ready.set()
        with pytest.raises(Refused):
            await rest

    asyncio.run(main())


async def waits_forever(seen: list[str]) -> None:
    """Waits on an event nobody sets; notes a cancellation thrown in where it waits."""
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        seen.append("cancelled where it waited")
        raise


def test_cancelling_the_task_that_awaits_the_rest_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def main() -> None:
        rest = run_until_blocked(waits_forever(seen))
        assert rest is not None
        task = asyncio.get_running_loop().create_task(rest)
        await asyncio.sleep(0)  # one turn: the task waits on the event's future now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled where it waited"]

    asyncio.run(main())


def test_a_bare_yield_gives_the_loop_one_turn_and_other_awaitables_go_to_the_task_whole() -> None:
    steps: list[str] = []

    async def yields_once() -> None:
        steps.append("before")
        await asyncio.sleep(0)
        steps.append("after")

    async def main() -> None:
        rest = run_until_blocked(yields_once())
        assert rest is not None and steps == ["before"]
        await rest
        assert steps == ["before", "after"]
        future = asyncio.get_running_loop().create_future()
        left = run_until_blocked(future)  # not a coroutine: nothing runs in place
        assert left is not None
        future.set_result(None)
        await left

    asyncio.run(main())


def test_a_coroutine_that_yields_something_else_than_a_future_is_refused() -> None:
    @types.coroutine
    def odd_yield() -> Generator[Any, None, None]:
        yield "not a future"

    async def uses_it() -> None:
        await odd_yield()

    async def main() -> None:
        rest = run_until_blocked(uses_it())
        assert rest is not None
        with pytest.raises(RuntimeError, match="not an asyncio future"):
            await rest

    asyncio.run(main())


# -- run_for_result: the body read's value, in place or from the rest ------------------------------------------


def test_a_value_ready_at_once_is_returned_in_place_and_a_later_one_by_the_rest() -> None:
    async def read(ready: asyncio.Event | None) -> bytes:
        if ready is not None:
            await ready.wait()
        return b"body"

    async def main() -> None:
        assert run_for_result(read(None)) == Ready(b"body")
        ready = asyncio.Event()
        rest = run_for_result(read(ready))
        assert not isinstance(rest, Ready)
        asyncio.get_running_loop().call_soon(ready.set)
        assert await rest == b"body"

    asyncio.run(main())


def test_a_refusal_before_the_first_wait_is_raised_in_place() -> None:
    async def refuses() -> bytes:
        raise ValueError("too large")

    with pytest.raises(ValueError, match="too large"):
        run_for_result(refuses())


def test_a_timeout_around_the_rest_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []

    async def main() -> None:
        rest = run_for_result(waits_forever(seen))
        assert not isinstance(rest, Ready)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0):
                await rest

    asyncio.run(main())
    assert seen == ["cancelled where it waited"]
