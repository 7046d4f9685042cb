"""The relay's sink (gateway/proxy/forward.py, ClientSink): each upstream read goes to the client through the
server's body writer when it offers one and accepts, else as an ASGI message through the server's `send`; the
watch and the time to first content are the same either way."""

from __future__ import annotations

import pytest

from gateway.asgi.io import Message
from gateway.proxy.forward import ClientSink
from gateway.proxy.record import Exchange
from gateway.proxy.sse import StreamWatch

READS = [b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n',
         b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\n',
         b'data: {"choices":[{"delta":{"content":"lo"}}]}\n\ndata: {"choices":[{"delta":{"content":"!"}}]}\n\n',
         b"data: [DONE]\n\n"]


class Client:
    """The server's side as the sink sees it: `send` and a body writer that accepts as told."""

    def __init__(self, accepts: list[bool]) -> None:
        self.accepts = accepts
        self.written: list[bytes] = []
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    def write(self, body: bytes) -> bool:
        accepted = self.accepts.pop(0)
        if accepted:
            self.written.append(body)
        return accepted


@pytest.mark.parametrize("accepts", [[True] * 4, [False] * 4, [True, False, True, False]])
def test_each_read_goes_through_the_writer_unless_it_declines(accepts: list[bool]) -> None:
    client = Client(list(accepts))
    exchange = Exchange(request_id="r", route="/v1/chat/completions", started=0.0)
    sink = ClientSink(exchange, StreamWatch(strip_usage=False), client.send, client.write).pass_on
    assert [sink(read) for read in READS] == [None] * len(READS)
    assert client.written == [read for read, accepted in zip(READS, accepts, strict=True) if accepted]
    assert client.sent == [{"type": "http.response.body", "body": read, "more_body": True}
                           for read, accepted in zip(READS, accepts, strict=True) if not accepted]
    assert exchange.ttft_s is not None


def test_without_a_writer_every_read_is_sent() -> None:
    client = Client([])
    exchange = Exchange(request_id="r", route="/v1/chat/completions", started=0.0)
    sink = ClientSink(exchange, StreamWatch(strip_usage=False), client.send).pass_on
    for read in READS:
        assert sink(read) is None
    assert [message["body"] for message in client.sent] == READS


def test_the_last_read_is_watched_and_returned_not_written() -> None:
    """A stream whose whole answer came in its last read (one token, say): its first content and its usage are
    seen, a shadowed request captures it, and its bytes come back for the final write instead of going out."""
    client = Client([])
    exchange = Exchange(request_id="r", route="/v1/chat/completions", started=0.0, capture=bytearray())
    watch = StreamWatch(strip_usage=True)
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":1}}\n\n'
    whole = READS[1] + usage + b"data: [DONE]\n\n"
    sink = ClientSink(exchange, watch, client.send, client.write)
    assert sink.last(b"") == b""
    assert sink.last(whole) == READS[1] + b"data: [DONE]\n\n"  # the usage the client did not ask for is cut
    assert client.sent == [] and client.written == []
    assert exchange.ttft_s is not None
    assert watch.usage is not None and watch.usage.prompt_tokens == 7
    assert exchange.capture == bytearray(whole)
