"""The relay's upstream client over real loopback sockets: scripted HTTP servers for keep-alive, stale idle
connections, read timeouts, bodies ended by the connection, malformed answers, flow control and failover."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Coroutine
from typing import Any

import pytest

from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Outbound
from gateway.proxy.upstream import (
    PAUSE_AT_BYTES,
    AnswerTooLarge,
    Slots,
    UpstreamClient,
    UpstreamConnectError,
    UpstreamReadTimeout,
    UpstreamResponse,
    UpstreamTransportError,
    open_first_reachable,
)
from gateway.tasks import TaskSupervisor
from tests.gateway.scripted_upstream import ScriptedServer, answer_ok, drop_second_request, serve

JSON = {"content-type": "application/json"}
WHOLE = 64 * 1024 * 1024  # the bound on a whole read where a test does not test it
PATH = "/v1/completions"


def base(url: str) -> str:
    return url.removesuffix(PATH)


def new_client(read_timeout_s: float = 5.0) -> UpstreamClient:
    return UpstreamClient(connections=8, connect_timeout_s=5, read_timeout_s=read_timeout_s)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_keeps_connections_alive_and_sends_the_request_intact() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        for index in range(3):
            response = await client.open("POST", base(url), PATH, {**JSON, "x-request-id": f"r{index}"},
                                         b'{"n":%d}' % index)
            assert (response.status, await response.read(WHOLE)) == (200, b"{}")
            response.release()
        client.close()
        assert server.connections == 1
        assert server.requests[2].startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\nx-request-id: r2\r\n" in server.requests[2] and server.requests[2].endswith(b'{"n":2}')

    asyncio.run(serve(answer_ok, calls))


def test_a_base_url_with_a_path_keeps_it_and_credentials_never_reach_the_host_header() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        with_path = base(url).replace("http://", "http://user:secret@") + "/prefix"
        response = await client.open("POST", with_path, PATH, JSON, b"{}")
        assert await response.read(WHOLE) == b"{}"
        response.release()
        client.close()
        assert server.requests[0].startswith(b"POST /prefix/v1/completions HTTP/1.1\r\n")
        assert b"secret" not in server.requests[0]

    asyncio.run(serve(answer_ok, calls))


def test_an_idle_connection_the_upstream_dropped_is_replaced_without_failing() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        for _ in range(2):
            response = await client.open("POST", base(url), PATH, JSON, b"{}")
            assert await response.read(WHOLE) == b"{}"
            response.release()
        client.close()
        assert server.connections == 2

    asyncio.run(serve(drop_second_request, calls))


def test_a_stream_is_read_as_it_arrives_and_a_body_may_end_with_the_connection() -> None:
    async def stream_then_close(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\ndata: 1\n\n")
        await writer.drain()
        writer.write(b"data: 2\n\n")
        await writer.drain()
        writer.close()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        assert response.headers["content-type"] == "text/event-stream"
        chunks = []
        while chunk := await response.next_chunk():
            chunks.append(chunk)
        response.release()
        client.close()
        assert b"".join(chunks) == b"data: 1\n\ndata: 2\n\n"

    asyncio.run(serve(stream_then_close, calls))


def test_silence_past_the_read_timeout_fails_the_stream() -> None:
    async def stall(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(5)

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client(read_timeout_s=0.2)
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        assert await response.next_chunk() == b"data: 1\n\n"
        with pytest.raises(UpstreamReadTimeout):
            await response.next_chunk()
        response.close()
        client.close()

    asyncio.run(serve(stall, calls))


def test_an_upstream_that_closes_mid_body_or_answers_garbage_fails_with_a_transport_error() -> None:
    async def cut_or_garbage(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        if connection == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
        else:
            writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        await writer.drain()
        writer.close()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        with pytest.raises(UpstreamTransportError):
            await response.read(WHOLE)
        response.close()
        with pytest.raises(UpstreamTransportError):
            await client.open("POST", base(url), PATH, JSON, b"{}")
        client.close()

    asyncio.run(serve(cut_or_garbage, calls))


LARGE = 3 * PAUSE_AT_BYTES


async def answer_large(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
    """Every request gets a LARGE body of `x`."""
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % LARGE + b"x" * LARGE)
    await writer.drain()


def test_a_large_body_pauses_reading_and_still_arrives_whole() -> None:
    size = LARGE

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        deadline = asyncio.get_running_loop().time() + 10
        while not response.reading_paused:  # the relay does not read: the connection must stop buffering
            assert asyncio.get_running_loop().time() < deadline, "reading never paused"
            await asyncio.sleep(0.01)
        first = await response.next_chunk()
        assert len(first) <= 2 * PAUSE_AT_BYTES  # what was buffered before reading paused, not the whole body
        assert len(first) + len(await response.read(WHOLE)) == size
        response.release()
        client.close()

    asyncio.run(serve(answer_large, calls))


def test_a_whole_read_stops_at_its_bound_and_the_connection_is_not_reused() -> None:
    """Past `max_bytes` a whole read gives up instead of holding the rest, and closes the connection: the rest of
    that answer must never be read as the start of the next one."""
    size = LARGE

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        with pytest.raises(AnswerTooLarge):
            await response.read(size - 1)
        response.release()  # as a caller's cleanup would: nothing is left to give back
        again = await client.open("POST", base(url), PATH, JSON, b"{}")
        assert len(await again.read(size)) == size
        again.release()
        client.close()
        assert server.connections == 2

    asyncio.run(serve(answer_large, calls))


async def relayed(response: UpstreamResponse, first_taken: asyncio.Event | None = None) -> list[bytes]:
    """Pump a response into a list; `first_taken` is set once the sink took its first bytes."""
    taken: list[bytes] = []

    def sink(chunk: bytes) -> None:
        taken.append(chunk)
        if first_taken is not None:
            first_taken.set()

    await response.pump(sink)
    return taken


def test_pump_hands_each_read_to_the_sink_as_it_arrives_and_the_connection_is_reused() -> None:
    first_taken = asyncio.Event()

    async def stream_in_pieces(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await first_taken.wait()  # the rest comes after the sink has taken the first piece
        writer.write(b"9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n0\r\n\r\n")
        await writer.drain()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        for _ in range(2):
            first_taken.clear()
            response = await client.open("POST", base(url), PATH, JSON, b"{}")
            taken = await relayed(response, first_taken)
            # One hand-off per read: the second read's two HTTP chunks reach the sink together (under load, one
            # client write per event instead cost the relay a fifth of its throughput at c=256).
            assert taken == [b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n"]
            response.release()
        client.close()
        assert server.connections == 1  # the second request reused the connection

    asyncio.run(serve(stream_in_pieces, calls))


def test_pump_keeping_the_last_read_returns_it_instead_of_handing_it_to_the_sink() -> None:
    """The relay writes the read that completes a stream together with the end of its response: `keep_last` hands
    every earlier read to the sink and returns that one; a body that arrived whole before the pump started is
    returned whole; without `keep_last` the sink gets every read and the pump returns nothing."""
    first_taken = asyncio.Event()

    async def stream_in_two_reads(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
        if index == 1:  # the whole answer in one write, with the head
            writer.write(head + b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n")
            await writer.drain()
            return
        writer.write(head + b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await first_taken.wait()
        writer.write(b"9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n0\r\n\r\n")
        await writer.drain()

    async def pumped(response: UpstreamResponse, keep_last: bool) -> tuple[list[bytes], bytes]:
        taken: list[bytes] = []

        def sink(chunk: bytes) -> None:
            taken.append(chunk)
            first_taken.set()

        returned = await response.pump(sink, keep_last=keep_last)
        response.release()
        return taken, returned

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        first_taken.clear()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        assert await pumped(response, keep_last=True) == ([b"data: 1\n\n"], b"data: 2\n\ndata: 3\n\n")
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        while not response.arrived:  # the whole answer is read before the pump starts
            await asyncio.sleep(0)
        assert await pumped(response, keep_last=True) == ([], b"data: 1\n\ndata: 2\n\n")
        first_taken.clear()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        assert await pumped(response, keep_last=False) == ([b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n"], b"")
        client.close()
        assert server.connections == 1  # a kept last read leaves the connection reusable

    asyncio.run(serve(stream_in_two_reads, calls))


def test_a_sink_that_must_wait_gets_what_arrived_meanwhile_after_its_wait_in_order() -> None:
    """The relay's sink returns the rest of a `send` that waits for a slow client: the pump awaits it, and the
    reads that arrive meanwhile are buffered, then passed on in order; none reaches the sink while it waits."""
    first_taken = asyncio.Event()

    async def stream_in_two_reads(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await first_taken.wait()  # the sink is waiting now
        writer.write(b"9\r\ndata: 2\n\n\r\n9\r\ndata: 3\n\n\r\n0\r\n\r\n")
        await writer.drain()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        taken: list[bytes] = []
        waiting = False

        async def finish_first() -> None:
            nonlocal waiting
            while not response.arrived:  # the rest is read (and buffered) while the sink still waits
                await asyncio.sleep(0)
            waiting = False

        def sink(chunk: bytes) -> Coroutine[Any, Any, None] | None:
            nonlocal waiting
            assert not waiting, "a read was passed on while the sink still waited"
            taken.append(chunk)
            if len(taken) == 1:
                waiting = True
                first_taken.set()
                return finish_first()
            return None

        await response.pump(sink)
        assert taken == [b"data: 1\n\n", b"data: 2\n\ndata: 3\n\n"]  # one hand-off per read, in order
        response.release()
        client.close()

    asyncio.run(serve(stream_in_two_reads, calls))


def test_pump_raises_the_sinks_own_error_and_a_cut_stream_as_a_transport_error() -> None:
    pumping = asyncio.Event()

    async def cut(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        await writer.drain()
        await pumping.wait()  # the body reaches the sink from the read callback, not from what was buffered
        writer.write(b"partial")
        await writer.drain()
        if connection == 1:
            writer.close()

    class SinkFailed(Exception):
        pass

    def failing_sink(chunk: bytes) -> None:
        raise SinkFailed

    async def start_body() -> None:
        await asyncio.sleep(0)  # one turn of the loop: the pump is waiting by now
        pumping.set()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        with pytest.raises(SinkFailed):  # not disguised as malformed HTTP from the upstream
            await asyncio.gather(response.pump(failing_sink), start_body())
        response.close()
        pumping.clear()
        response = await client.open("POST", base(url), PATH, JSON, b"{}")
        with pytest.raises(UpstreamTransportError):
            await asyncio.gather(relayed(response), start_body())
        response.close()
        client.close()

    asyncio.run(serve(cut, calls))


def test_a_refused_connection_marks_the_upstream_down_and_the_next_candidate_answers() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = new_client()
        health = UpstreamHealth()
        dead = f"http://127.0.0.1:{closed_port()}"
        outbound = Outbound("POST", [dead, base(url)], PATH, JSON, b"{}")
        upstream, response = await open_first_reachable(client, health, outbound)
        assert upstream == base(url) and await response.read(WHOLE) == b"{}"
        response.release()
        assert not health.is_up(dead)
        with pytest.raises(UpstreamConnectError):
            await open_first_reachable(client, health, Outbound("POST", [dead], PATH, JSON, b"{}"))
        client.close()

    asyncio.run(serve(answer_ok, calls))


def test_slots_bound_holders_serve_waiters_in_order_and_pass_on_a_cancelled_waiters_slot() -> None:
    async def run() -> None:
        slots = Slots(1)
        await slots.acquire()
        order: list[str] = []

        async def take(name: str) -> None:
            await slots.acquire()
            order.append(name)

        tasks = TaskSupervisor("slots-test")
        first = tasks.spawn(take("first"), "first")
        cancelled = tasks.spawn(take("cancelled"), "cancelled")
        last = tasks.spawn(take("last"), "last")
        await asyncio.sleep(0)  # each task ran up to its wait (no timing: one loop turn starts them all)
        assert order == [] and slots.used == 1
        cancelled.cancel()
        slots.release()  # to "first"
        await first
        slots.release()  # "cancelled" is gone: to "last"
        await last
        assert order == ["first", "last"] and slots.used == 1
        slots.release()
        assert slots.used == 0
        await tasks.close()

    asyncio.run(run())
