"""The shadow client (the relay's `UpstreamClient` in an instance of its own, read whole and timed) over real
loopback sockets: against the simulator, and against small scripted HTTP servers for what a well-behaved server
never does (close early, answer garbage, drop idle connections, answer too much)."""

from __future__ import annotations

import asyncio
import ssl
import time

import httpx
import pytest
import trustme

from gateway.devtools.localproc import ServerProcess
from gateway.proxy.sse import stream_usage
from gateway.proxy.upstream import AnswerTooLarge, UpstreamClient, UpstreamConnectError, UpstreamTransportError
from gateway.shadow.client import AnswerCollector, ShadowAnswer, ShadowClient
from gateway.shadow.compare import generated_text
from tests.gateway.conftest import SIM_MODEL, UPSTREAM_KEY
from tests.gateway.scripted_upstream import ScriptedServer, answer_ok, drop_second_request, serve

JSON = {"content-type": "application/json"}
SIM_AUTH = {**JSON, "authorization": f"Bearer {UPSTREAM_KEY}"}
CLOSE_HEAD = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"
PATH = "/v1/completions"

def shadow_client(tls: ssl.SSLContext | None = None, max_body_bytes: int | None = None) -> ShadowClient:
    upstream = UpstreamClient(connections=8, connect_timeout_s=5, read_timeout_s=5, tls=tls)
    return ShadowClient(upstream) if max_body_bytes is None else ShadowClient(upstream, max_body_bytes)


async def post(client: ShadowClient, url: str, headers: dict[str, str], body: bytes,
               watch_content: bool = False) -> ShadowAnswer:
    """POST to a full URL: the pool's base URL is everything before the route path."""
    base, path, query = url.partition(PATH)
    return await client.post(base, path + query, headers, body, watch_content)


def completion(stream: bool) -> bytes:
    body = {"model": SIM_MODEL, "prompt": "shadow client", "max_tokens": 5, "temperature": 0, "stream": stream,
            "stream_options": {"include_usage": True}} if stream else {
        "model": SIM_MODEL, "prompt": "shadow client", "max_tokens": 5, "temperature": 0}
    return httpx.Request("POST", "http://x", json=body).content


def test_reads_a_simulator_stream_whole_with_its_first_content_and_usage(sim: ServerProcess) -> None:
    async def run() -> None:
        client = shadow_client()
        url = f"{sim.url}/v1/completions"
        streamed = await post(client, url, SIM_AUTH, completion(stream=True), watch_content=True)
        whole = await post(client, url, SIM_AUTH, completion(stream=False), watch_content=False)
        client.close()
        assert streamed.status == 200 and streamed.first_content_at is not None
        assert streamed.body.endswith(b"data: [DONE]\n\n")
        usage = stream_usage(streamed.body)
        assert usage is not None and usage.completion_tokens == 5
        assert whole.status == 200 and whole.first_content_at is None
        assert generated_text(streamed.body) == generated_text(whole.body) != ""

    asyncio.run(run())


def test_passes_error_answers_through_with_their_status(sim: ServerProcess) -> None:
    async def run() -> None:
        client = shadow_client()
        answer = await post(client, f"{sim.url}/v1/completions", SIM_AUTH, b'{"model":"nope","prompt":"x"}', True)
        client.close()
        assert answer.status == 404 and b"does not exist" in answer.body

    asyncio.run(run())


def test_keeps_connections_alive_and_sends_the_request_intact() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client()
        for index in range(3):
            answer = await post(client, url, {**JSON, "x-request-id": f"r{index}"}, b'{"n":%d}' % index, False)
            assert (answer.status, answer.body) == (200, b"{}")
        client.close()
        assert server.connections == 1
        assert server.requests[2].startswith(b"POST /v1/completions HTTP/1.1\r\n")
        assert b"\r\nx-request-id: r2\r\n" in server.requests[2] and server.requests[2].endswith(b'{"n":2}')

    asyncio.run(serve(answer_ok, calls))


def test_opens_a_new_connection_after_connection_close() -> None:
    async def say_close(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(CLOSE_HEAD)
        await writer.drain()
        writer.close()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client()
        for _ in range(2):
            assert (await post(client, url, JSON, b"{}", False)).status == 200
        client.close()
        assert server.connections == 2

    asyncio.run(serve(say_close, calls))


def test_an_idle_connection_the_upstream_dropped_is_replaced_without_failing() -> None:
    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client()
        for _ in range(2):
            assert (await post(client, url, JSON, b"{}", False)).status == 200
        client.close()
        assert server.connections == 2 and len(server.requests) == 3

    asyncio.run(serve(drop_second_request, calls))


def test_speaks_tls_to_https_upstreams_and_verifies_them() -> None:
    authority = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server_tls)
    trusting = ssl.create_default_context()
    authority.configure_trust(trusting)

    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client(tls=trusting)
        for _ in range(2):
            assert (await post(client, url, JSON, b"{}", False)).body == b"{}"
        client.close()
        assert server.connections == 1
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await post(shadow_client(), url, JSON, b"{}", False)  # not trusted by default

    asyncio.run(serve(answer_ok, calls, server_tls))


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"partial\":",  # closes mid-body
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\ndata:",  # closes mid-chunk
    b"NOT HTTP AT ALL\r\n\r\n",
])
def test_broken_answers_fail_cleanly(reply: bytes) -> None:
    async def broken(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        writer.write(reply)
        await writer.drain()
        writer.close()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client()
        with pytest.raises(UpstreamTransportError):
            await post(client, url, JSON, b"{}", True)
        client.close()
        assert server.connections == 1  # an answer that started is never sent again

    asyncio.run(serve(broken, calls))


def test_unreachable_upstream_and_header_injection_are_transport_errors() -> None:
    async def run() -> None:
        client = shadow_client()
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(UpstreamConnectError, match="cannot connect"):
            await post(client, f"http://127.0.0.1:{port}/v1/completions", JSON, b"{}", False)
        with pytest.raises(UpstreamTransportError, match="line break"):
            await post(client, f"http://127.0.0.1:{port}/v1/completions", {"x-a": "1\r\nx-b: 2"}, b"{}", False)
        with pytest.raises(UpstreamTransportError, match="scheme"):
            await post(client, "ftp://127.0.0.1/v1/completions", JSON, b"{}", False)

    asyncio.run(run())


def test_an_answer_past_the_body_limit_is_abandoned_and_its_connection_not_reused() -> None:
    async def too_long_then_fitting(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        body = b"x" * (65 if connection == 0 else 64)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client(max_body_bytes=64)
        with pytest.raises(AnswerTooLarge):
            await post(client, url, JSON, b"{}")
        assert (await post(client, url, JSON, b"{}")).body == b"x" * 64  # exactly the limit is kept
        client.close()
        assert server.connections == 2

    asyncio.run(serve(too_long_then_fitting, calls))


@pytest.mark.parametrize("ending", ["read timeout", "abandoned"])
def test_a_shadow_that_fails_or_is_abandoned_mid_answer_gives_its_connection_slot_back(ending: str) -> None:
    """One connection slot: a failed or cancelled answer that kept its slot would hold every later shadow."""
    async def stall_first(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        if connection == 0:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\ndata: 1\n\n")
            await writer.drain()
            await asyncio.Event().wait()  # never more
        await answer_ok(connection, index, writer)

    async def calls(url: str, server: ScriptedServer) -> None:
        read_timeout_s = 0.2 if ending == "read timeout" else 3600.0
        client = ShadowClient(UpstreamClient(connections=1, connect_timeout_s=5, read_timeout_s=read_timeout_s))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2 if ending == "abandoned" else None):  # as KVGATE_SHADOW_TIMEOUT_S does
                await post(client, url, JSON, b"{}", watch_content=True)
        async with asyncio.timeout(30):  # a leaked slot waits forever; fail instead
            assert (await post(client, url, JSON, b"{}")).body == b"{}"
        client.close()
        assert server.connections == 2

    asyncio.run(serve(stall_first, calls))


def test_an_answer_without_content_events_has_no_first_content() -> None:
    async def only_role_and_done(connection: int, index: int, writer: asyncio.StreamWriter) -> None:
        events = b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\ndata: [DONE]\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(events), events))
        await writer.drain()

    async def calls(url: str, server: ScriptedServer) -> None:
        client = shadow_client()
        answer = await post(client, url, JSON, b"{}", watch_content=True)
        client.close()
        assert answer.body.endswith(b"data: [DONE]\n\n") and answer.first_content_at is None

    asyncio.run(serve(only_role_and_done, calls))


def test_first_content_is_noted_when_its_event_completes_not_at_the_first_byte() -> None:
    """The collector is the pump's sink: the connection feeds it each read as it arrives."""
    reads = [b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',  # no generated content
             b'data: {"choices":[{"delta":{"content":"Hel', b'lo"}}]}\n', b"\n",
             b'data: {"choices":[{"delta":{"content":" again"}}]}\n\n']
    collector = AnswerCollector(watch_content=True, max_bytes=1024)
    collector.take(reads[0])
    collector.take(reads[1])
    assert collector.first_content_at is None  # the content event is not complete yet
    before = time.perf_counter()
    collector.take(reads[2])
    collector.take(reads[3])
    noted = collector.first_content_at
    assert noted is not None and noted >= before
    collector.take(reads[4])
    assert collector.first_content_at == noted  # the first one only
    assert collector.body() == b"".join(reads) and collector.size == len(b"".join(reads))


def test_an_unwatched_answer_is_collected_without_looking_for_content() -> None:
    collector = AnswerCollector(watch_content=False, max_bytes=1024)
    collector.take(b'data: {"choices":[{"text":"hi"}]}\n\n')
    assert collector.first_content_at is None and collector.body() == b'data: {"choices":[{"text":"hi"}]}\n\n'
