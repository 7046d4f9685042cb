"""The raw-ASGI helpers driven with ASGI message sequences: bounded body reads (declared and actual size, chunked,
disconnects), whole responses and OpenAI-shaped errors as the messages a server receives, and the guard that
cancels a request's own task when its client goes away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from typing import Any

import pytest

from gateway.asgi.disconnect import DISCONNECT_EXTENSION, DisconnectGuard, DisconnectNotice, disconnect_notice
from gateway.asgi.io import ClientDisconnected, header, read_body, send_body, send_error, wait_disconnect
from gateway.errors import BadRequest, PayloadTooLarge, TooManyRequests

Message = dict[str, Any]


def scope(*headers: tuple[bytes, bytes]) -> dict[str, Any]:
    return {"type": "http", "headers": list(headers)}


def receiver(messages: list[Message]) -> Callable[[], Awaitable[Message]]:
    queue = list(messages)

    async def receive() -> Message:
        return queue.pop(0)

    return receive


def body(data: bytes, more: bool = False) -> Message:
    return {"type": "http.request", "body": data, "more_body": more}


DISCONNECT: Message = {"type": "http.disconnect"}


def read(messages: list[Message], limit: int = 10, *headers: tuple[bytes, bytes]) -> bytes:
    return asyncio.run(read_body(scope(*headers), receiver(messages), limit))


@pytest.mark.parametrize(("messages", "expected"), [
    ([body(b"")], b""),
    ([{"type": "http.request"}], b""),  # no body key, no more_body: an empty body
    ([body(b"abc")], b"abc"),
    ([body(b"ab", True), body(b"", True), body(b"cd")], b"abcd"),
    ([body(b"0123456789")], b"0123456789"),  # exactly the limit
    ([body(b"01234", True), body(b"56789")], b"0123456789"),
])
def test_a_body_is_read_whole_up_to_the_limit(messages: list[Message], expected: bytes) -> None:
    assert read(messages) == expected


@pytest.mark.parametrize("messages", [
    [body(b"0123456789A")],
    [body(b"012345", True), body(b"67890")],
    [body(b"0123456789", True), body(b"x", True), DISCONNECT],  # refused as soon as it is over, not at the end
])
def test_a_body_over_the_limit_is_413(messages: list[Message]) -> None:
    with pytest.raises(PayloadTooLarge, match=r"The request body exceeds 10 bytes\."):
        read(messages)


@pytest.mark.parametrize(("declared", "refused"), [
    (b"11", True), (b"10", False), (b"0", False), (b"99999999999999999999", True),
    (b"abc", False), (b"-5", False), (b"", False),  # not a number: the bytes that arrive decide
])
def test_a_declared_length_over_the_limit_is_refused_before_reading(declared: bytes, refused: bool) -> None:
    messages: list[Message] = [body(b"ok")]
    if refused:
        with pytest.raises(PayloadTooLarge):
            read([], 10, (b"content-length", declared))  # nothing is received at all
    else:
        assert read(messages, 10, (b"content-length", declared)) == b"ok"


@pytest.mark.parametrize("messages", [[DISCONNECT], [body(b"ab", True), DISCONNECT]])
def test_a_client_that_leaves_mid_body_is_a_disconnect(messages: list[Message]) -> None:
    with pytest.raises(ClientDisconnected):
        read(messages)


def test_headers_are_matched_exactly_and_the_first_wins() -> None:
    headers = scope((b"x-a", b"1"), (b"content-length", b"5"), (b"x-a", b"2"))
    assert header(headers, b"x-a") == b"1"
    assert header(headers, b"content-length") == b"5"
    assert header(headers, b"Content-Length") is None  # ASGI servers lower-case names
    assert header(scope(), b"x-a") is None


def test_wait_disconnect_skips_everything_until_the_disconnect() -> None:
    receive = receiver([body(b"late", True), body(b""), DISCONNECT, body(b"never read")])
    asyncio.run(wait_disconnect(receive))


Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def sent_messages(action: Callable[[Send], Coroutine[Any, Any, None]]) -> list[MutableMapping[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    asyncio.run(action(send))
    return sent


def test_a_whole_response_is_a_start_with_its_length_then_one_body() -> None:
    sent = sent_messages(lambda send: send_body(send, 201, "ünï".encode(), [(b"x-a", b"1")]))
    assert sent == [
        {"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1"), (b"content-length", b"5")]},
        {"type": "http.response.body", "body": "ünï".encode()},
    ]


@pytest.mark.parametrize(("error", "status", "extra"), [
    (BadRequest("stream must be a boolean.", param="stream"), 400, []),
    (TooManyRequests("slow down", retry_after_s=7), 429, [(b"retry-after", b"7")]),
])
def test_an_error_response_is_openai_shaped_json(error: BadRequest | TooManyRequests, status: int,
                                                 extra: list[tuple[bytes, bytes]]) -> None:
    sent = sent_messages(lambda send: send_error(send, error, error.headers()))
    start, payload = sent
    assert start["status"] == status
    assert start["headers"][:1 + len(extra)] == [(b"content-type", b"application/json"), *extra]
    assert dict(start["headers"])[b"content-length"] == str(len(payload["body"])).encode()
    assert json.loads(payload["body"]) == {"error": {"message": error.message, "type": error.error_type,
                                                     "param": error.param, "code": error.code}}


# --- the disconnect guard -------------------------------------------------------------------------------------------
# Both ways of hearing that the client left: the server's notice (kvgate's protocol calls it from connection_lost)
# and, under other servers, a watcher task reading `http.disconnect` from receive().

BOTH = pytest.mark.parametrize("notice", [False, True], ids=["watcher", "notice"])


class Client:
    """One request's client: leaves when the test says so."""

    def __init__(self, notice: bool) -> None:
        self.left = asyncio.Event()
        self.notice = DisconnectNotice() if notice else None

    async def receive(self) -> Message:
        await self.left.wait()
        return DISCONNECT

    def guard(self) -> DisconnectGuard:
        return DisconnectGuard(self.receive, self.notice)

    def leave(self) -> None:
        self.left.set()
        if self.notice is not None:
            self.notice.connection_lost()


@BOTH
def test_a_body_that_finishes_first_is_not_disturbed(notice: bool) -> None:
    async def run() -> tuple[bool, str]:
        async with Client(notice).guard() as guard:
            result = "done"
        return guard.disconnected, result

    assert asyncio.run(run()) == (False, "done")


@BOTH
def test_a_disconnect_cancels_the_body_and_the_cancellation_is_absorbed(notice: bool) -> None:
    async def run() -> tuple[bool, bool, bool]:
        client = Client(notice)
        reached_end = False
        async with client.guard() as guard:
            client.leave()
            await asyncio.Event().wait()  # an upstream that never answers
            reached_end = True
        task = asyncio.current_task()
        assert task is not None
        return guard.disconnected, reached_end, task.cancelling() == 0

    assert asyncio.run(run()) == (True, False, True)  # and the task is not left half-cancelled


@BOTH
def test_an_error_in_the_body_still_propagates(notice: bool) -> None:
    async def run() -> None:
        async with Client(notice).guard():
            raise ValueError("upstream broke")

    with pytest.raises(ValueError, match="upstream broke"):
        asyncio.run(run())


@BOTH
def test_a_cancellation_from_elsewhere_is_not_swallowed(notice: bool) -> None:
    async def request() -> None:
        async with Client(notice).guard():
            await asyncio.Event().wait()

    async def run() -> None:
        task = asyncio.get_running_loop().create_task(request())
        await asyncio.sleep(0)  # let the request enter its guard (a turn of the loop, not a timed wait)
        task.cancel()  # shutdown, not the client
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())


@BOTH
def test_an_error_raised_while_a_disconnect_cancels_the_body_still_propagates(notice: bool) -> None:
    async def run() -> None:
        client = Client(notice)
        async with client.guard():
            client.leave()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                raise RuntimeError("cleanup failed") from None

    with pytest.raises(RuntimeError, match="cleanup failed"):
        asyncio.run(run())


def test_a_connection_lost_after_the_guard_exits_cancels_nothing() -> None:
    """The connection outlives the request (keep-alive): losing it later must not cancel the task's next work."""

    async def run() -> tuple[bool, str]:
        client = Client(notice=True)
        async with client.guard() as guard:
            pass
        client.leave()
        await asyncio.sleep(0)  # a cancellation, had one been requested, would be delivered here
        return guard.disconnected, "still running"

    assert asyncio.run(run()) == (False, "still running")


def test_the_notice_is_found_only_in_its_own_extension() -> None:
    notice = DisconnectNotice()
    assert disconnect_notice({"type": "http", "extensions": {DISCONNECT_EXTENSION: {"notice": notice}}}) is notice
    assert disconnect_notice({"type": "http"}) is None
    assert disconnect_notice({"type": "http", "extensions": {DISCONNECT_EXTENSION: {"notice": object()}}}) is None
    assert disconnect_notice({"type": "http", "extensions": {DISCONNECT_EXTENSION: "notice"}}) is None
