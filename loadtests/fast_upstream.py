"""A fast stand-in for vLLM's OpenAI server, for proxy benchmarks: raw asyncio.Protocol HTTP/1.1 on uvloop.

It answers POST /v1/chat/completions and /v1/completions with vLLM-shaped chunks (vLLM 0.25 field order):
headers at once, the first token after `--ttft-ms`, then one token every `--token-ms` on a fixed schedule,
a final usage chunk when `stream_options.include_usage` is true, and `data: [DONE]`. Streams use chunked
transfer encoding and connections are kept alive. GET /health answers 200. Nothing is tokenized: prompt
tokens are estimated from the body size.

    python -m loadtests.fast_upstream --port 8000 --ttft-ms 20 --token-ms 2 --tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import msgspec
import uvloop

HEADER_END = b"\r\n\r\n"
MAX_HEAD_BYTES = 64 * 1024
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
LAST_CHUNK = b"0\r\n\r\n"
DONE_EVENT = b"data: [DONE]\n\n"
WORDS = (b" cache", b" block", b" tenant", b" offload", b" prefix", b" token", b" policy", b" gateway")
CHAT_PATH = "/v1/chat/completions"
GENERATE_PATHS = frozenset({CHAT_PATH, "/v1/completions"})


@dataclass(frozen=True)
class Pace:
    ttft_s: float
    token_s: float
    tokens: int  # used when the request names no max_tokens


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes
    close: bool


@dataclass(frozen=True)
class Generation:
    """What one generation request asked for."""

    chat: bool
    model: str
    stream: bool
    include_usage: bool
    tokens: int
    prompt_tokens: int


class BadRequestError(Exception):
    pass


def parse_head(buffer: bytearray) -> tuple[Request, int] | None:
    """The first complete request in `buffer` and how many bytes it used; None while incomplete."""
    end = buffer.find(HEADER_END)
    if end < 0:
        if len(buffer) > MAX_HEAD_BYTES:
            raise BadRequestError("request head too large")
        return None
    lines = bytes(buffer[:end]).decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    if "transfer-encoding" in headers:
        raise BadRequestError("chunked request bodies are not supported")
    total = end + len(HEADER_END) + int(headers.get("content-length", "0"))
    if len(buffer) < total:
        return None
    close = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
    body = bytes(buffer[end + len(HEADER_END) : total])
    return Request(method, target.split("?", 1)[0], body, close), total


def generation(request: Request, pace: Pace) -> Generation:
    try:
        body = msgspec.json.decode(request.body)
    except msgspec.DecodeError as error:
        raise BadRequestError(str(error)) from None
    if not isinstance(body, dict):
        raise BadRequestError("the body must be a JSON object")
    options = body.get("stream_options")
    tokens = body.get("max_tokens") or body.get("max_completion_tokens") or pace.tokens
    return Generation(
        chat=request.path == CHAT_PATH,
        model=str(body.get("model", "m")),
        stream=body.get("stream") is True,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        tokens=max(1, int(tokens)),
        prompt_tokens=max(1, len(request.body) // 4),
    )


def frame(*events: bytes) -> bytes:
    """Events as HTTP/1.1 chunks, one chunk per event."""
    return b"".join(b"%x\r\n%s\r\n" % (len(event), event) for event in events)


def plain_response(status: int, reason: str, body: bytes, close: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        + ("connection: close\r\n" if close else "")
        + "\r\n"
    )
    return head.encode() + body


class Events:
    """The byte form of one generation's SSE events, in vLLM's field order."""

    def __init__(self, gen: Generation) -> None:
        self.gen = gen
        kind = b"chat.completion.chunk" if gen.chat else b"text_completion"
        ident = (b"chatcmpl-" if gen.chat else b"cmpl-") + secrets.token_hex(8).encode()
        self.prefix = b'data: {"id":"%s","object":"%s","created":%d,"model":%s,"choices":' % (
            ident, kind, int(time.time()), msgspec.json.encode(gen.model))

    def role(self) -> bytes:
        return self.prefix + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,' \
            b'"finish_reason":null}]}\n\n'

    def token(self, index: int) -> bytes:
        text = WORDS[index % len(WORDS)]
        finish = b'"length"' if index == self.gen.tokens - 1 else b"null"
        if self.gen.chat:
            return self.prefix + b'[{"index":0,"delta":{"content":"%s"},"logprobs":null,"finish_reason":%s,' \
                b'"token_ids":null}]}\n\n' % (text, finish)
        return self.prefix + b'[{"index":0,"text":"%s","logprobs":null,"finish_reason":%s,"stop_reason":null,' \
            b'"prompt_token_ids":null,"token_ids":null}]}\n\n' % (text, finish)

    def usage(self) -> bytes:
        prompt, completion = self.gen.prompt_tokens, self.gen.tokens
        return self.prefix + b'[],"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d,' \
            b'"prompt_tokens_details":{"cached_tokens":0}},"system_fingerprint":"fast-upstream"}\n\n' % (
                prompt, prompt + completion, completion)

    def whole(self) -> bytes:
        """A non-streamed answer with the same text."""
        text = b"".join(WORDS[index % len(WORDS)] for index in range(self.gen.tokens)).decode()
        choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if self.gen.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        usage = {"prompt_tokens": self.gen.prompt_tokens, "completion_tokens": self.gen.tokens,
                 "total_tokens": self.gen.prompt_tokens + self.gen.tokens}
        return msgspec.json.encode({"id": "fast", "object": "chat.completion" if self.gen.chat else "text_completion",
                                    "model": self.gen.model, "choices": [choice], "usage": usage})


class Answer:
    """One timed response on a connection; calls `done` after its last byte is written."""

    def __init__(self, transport: asyncio.Transport, pace: Pace, gen: Generation, done: Callable[[], None]) -> None:
        self.transport = transport
        self.pace = pace
        self.events = Events(gen)
        self.done = done
        self.loop = asyncio.get_running_loop()
        self.first_at = self.loop.time() + pace.ttft_s
        self.sent = 0
        self.timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self.events.gen.stream:
            self.transport.write(STREAM_HEAD)
            self.timer = self.loop.call_at(self.first_at, self._emit)
        else:
            finish_at = self.first_at + self.pace.token_s * (self.events.gen.tokens - 1)
            self.timer = self.loop.call_at(finish_at, self._whole)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def _emit(self) -> None:
        index, gen = self.sent, self.events.gen
        events = [self.events.token(index)]
        if index == 0 and gen.chat:
            events.insert(0, self.events.role())
        self.sent += 1
        if self.sent < gen.tokens:
            self.transport.write(frame(*events))
            self.timer = self.loop.call_at(self.first_at + self.sent * self.pace.token_s, self._emit)
            return
        if gen.include_usage:
            events.append(self.events.usage())
        self.transport.write(frame(*events, DONE_EVENT) + LAST_CHUNK)
        self.timer = None
        self.done()

    def _whole(self) -> None:
        self.transport.write(plain_response(200, "OK", self.events.whole(), close=False))
        self.timer = None
        self.done()


class UpstreamProtocol(asyncio.Protocol):
    """One HTTP/1.1 connection: requests are answered one after another (pipelined ones wait their turn)."""

    def __init__(self, pace: Pace) -> None:
        self.pace = pace
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.answer: Answer | None = None
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None:
            self.answer.cancel()
        self.answer = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._serve_next()

    def _serve_next(self) -> None:
        while self.answer is None and self.transport is not None and not self.close_after:
            try:
                parsed = parse_head(self.buffer)
            except (BadRequestError, ValueError) as error:
                self._reply(400, "Bad Request", msgspec.json.encode({"error": str(error)}), close=True)
                return
            if parsed is None:
                return
            request, used = parsed
            del self.buffer[:used]
            self.close_after = request.close
            self._dispatch(request)

    def _dispatch(self, request: Request) -> None:
        if request.method == "GET" and request.path in ("/health", "/v1/models"):
            self._reply(200, "OK", b'{"object":"list","data":[{"id":"m","object":"model"}]}', request.close)
        elif request.method == "POST" and request.path in GENERATE_PATHS:
            self._generate(request)
        else:
            self._reply(404, "Not Found", b'{"error":"not found"}', request.close)

    def _generate(self, request: Request) -> None:
        assert self.transport is not None
        try:
            gen = generation(request, self.pace)
        except (BadRequestError, TypeError, ValueError) as error:
            self._reply(400, "Bad Request", msgspec.json.encode({"error": str(error)}), request.close)
            return
        self.answer = Answer(self.transport, self.pace, gen, self._answered)
        self.answer.start()

    def _answered(self) -> None:
        self.answer = None
        if self.close_after and self.transport is not None:
            self.transport.close()
        else:
            self._serve_next()

    def _reply(self, status: int, reason: str, body: bytes, close: bool) -> None:
        assert self.transport is not None
        self.transport.write(plain_response(status, reason, body, close))
        if close:
            self.close_after = True
            self.transport.close()


async def serve(host: str, port: int, pace: Pace) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await loop.create_server(lambda: UpstreamProtocol(pace), host, port, backlog=4096)
    await stop.wait()
    server.close()  # open keep-alive connections end with the process


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.fast_upstream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--token-ms", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=64, help="tokens when the request has no max_tokens")
    args = parser.parse_args(argv)
    pace = Pace(ttft_s=args.ttft_ms / 1000, token_s=args.token_ms / 1000, tokens=args.tokens)
    uvloop.run(serve(args.host, args.port, pace))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
