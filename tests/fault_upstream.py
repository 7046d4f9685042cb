"""A deliberately broken upstream for shadow and proxy tests, run as a real process:
`python -m tests.fault_upstream --port P --mode MODE`, MODE one of hang, status500, drop, gzip, gzip-always, echo,
giant-event, giant-whole, long-stream.

`gzip` compresses its JSON answer when the request's Accept-Encoding allows gzip (as a web server in front of
vLLM may); `gzip-always` compresses it whatever the request said, and labels it `content-encoding: gzip`.
`echo` answers 200 with the request body exactly as it arrived, so a test sees the bytes the gateway sent upstream.
`giant-event` streams a chat answer whose second event is GIANT_EVENT_BYTES long (`prompt_logprobs`, as vLLM sends
them for a long prompt), written 64 KiB at a time, then one content event, the usage event and `[DONE]`.
`giant-whole` answers by the request: a streamed one with the `giant-event` stream, one whose prompt is "fail" with a
500 of GIANT_EVENT_BYTES, any other (a GET too) with a 200 completion of GIANT_EVENT_BYTES (a `prompt_logprobs`
list), each written 64 KiB at a time.
`long-stream` streams a chat answer of LONG_STREAM_BYTES in content events of about 64 KiB, then the usage event
and `[DONE]`."""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ERROR_BODY = b'{"error":{"message":"broken on purpose","type":"InternalServerError","param":null,"code":500}}'
COMPLETION = (b'{"id":"cmpl-z","object":"text_completion","model":"sim-model","choices":[{"index":0,"text":"zipped",'
              b'"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}')
CHUNK = b'data: {"id":"cmpl-x","object":"text_completion","choices":[{"index":0,"text":"partial"}]}\n\n'
GIANT_EVENT_BYTES = 9 * 1024 * 1024  # past the gateway's 8 MiB bound on an event it holds to read
LONG_STREAM_BYTES = 70 * 1024 * 1024  # past the 64 MiB the gateway keeps of a reply for a shadow comparison
WRITE_BYTES = 64 * 1024


def chat_chunk(**fields: object) -> bytes:
    """One chat stream event, as vLLM writes it."""
    body = {"id": "chatcmpl-f", "object": "chat.completion.chunk", "model": "sim-model", **fields}
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def giant_stream() -> list[bytes]:
    """The `giant-event` answer, as its writes."""
    entry = b'{"1":{"logprob":-0.5,"rank":1,"decoded_token":"x"}},'
    giant = (b'data: {"id":"chatcmpl-f","object":"chat.completion.chunk","choices":[],"prompt_logprobs":['
             + entry * (GIANT_EVENT_BYTES // len(entry)) + b'{}]}\n\n')
    usage = {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}
    return [chat_chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
            *(giant[i:i + WRITE_BYTES] for i in range(0, len(giant), WRITE_BYTES)),
            chat_chunk(choices=[{"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}]),
            chat_chunk(choices=[], usage=usage), b"data: [DONE]\n\n"]


def long_stream() -> list[bytes]:
    """The `long-stream` answer, as its writes."""
    content = chat_chunk(choices=[{"index": 0, "delta": {"content": "x" * (WRITE_BYTES - 128)}}])
    events = LONG_STREAM_BYTES // len(content) + 1
    usage = {"prompt_tokens": 5, "completion_tokens": events, "total_tokens": 5 + events}
    return [chat_chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
            *[content] * events, chat_chunk(choices=[], usage=usage), b"data: [DONE]\n\n"]


class FaultyUpstream:
    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["path"] == "/health":
            await reply(send, 200, b"")
            return
        if self.mode == "echo":
            await reply(send, 200, await read_body(receive))
            return
        if self.mode == "giant-whole":
            body = await read_body(receive)
            await _giant_whole(json.loads(body) if body else {}, send)
            return
        await _drain(receive)
        if self.mode.startswith("gzip"):
            await _reply_gzip(scope, send, always=self.mode == "gzip-always")
        elif self.mode == "status500":
            await reply(send, 500, ERROR_BODY)
        elif self.mode in ("giant-event", "long-stream"):
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            for write in giant_stream() if self.mode == "giant-event" else long_stream():
                await send({"type": "http.response.body", "body": write, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif self.mode == "drop":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await send({"type": "http.response.body", "body": CHUNK, "more_body": True})
            raise ConnectionAbortedError("dropping the stream on purpose")
        else:
            await _wait_forever(receive)


async def _giant_whole(request: dict[str, Any], send: Send) -> None:
    if request.get("stream"):
        writes, status, content_type = giant_stream(), 200, b"text/event-stream"
    else:
        status = 500 if request.get("prompt") == "fail" else 200
        entries = b'{"1":{"logprob":-0.5}},' * (GIANT_EVENT_BYTES // 24)
        whole = (b'{"error":{"message":"' + b"x" * GIANT_EVENT_BYTES + b'","type":"InternalServerError","code":500}}'
                 if status == 500 else
                 b'{"id":"cmpl-g","object":"text_completion","model":"sim-model","prompt_logprobs":[' + entries
                 + b'{}],"choices":[{"index":0,"text":"hi","finish_reason":"length"}]}')
        writes = [whole[i:i + WRITE_BYTES] for i in range(0, len(whole), WRITE_BYTES)]
        content_type = b"application/json"
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", content_type)]})
    for write in writes:
        await send({"type": "http.response.body", "body": write, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _drain(receive: Receive) -> None:
    while (await receive()).get("more_body", False):
        pass


async def read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _wait_forever(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)


async def _reply_gzip(scope: Scope, send: Send, always: bool) -> None:
    accepted = b"".join(value for name, value in scope["headers"] if name == b"accept-encoding")
    if not always and b"gzip" not in accepted:
        await reply(send, 200, COMPLETION)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]})
    await send({"type": "http.response.body", "body": gzip.compress(COMPLETION)})


async def reply(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=("hang", "status500", "drop", "gzip", "gzip-always", "echo", "giant-event",
                                           "giant-whole", "long-stream"),
                        required=True)
    args = parser.parse_args()
    uvicorn.run(FaultyUpstream(args.mode), host="127.0.0.1", port=args.port, log_level="critical")


if __name__ == "__main__":
    main()
