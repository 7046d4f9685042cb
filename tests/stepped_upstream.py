"""An upstream that streams a chat answer one event at a time, each when the test says so, run as a real process:
`python -m tests.stepped_upstream --port P [--tokens N]`.

`POST /v1/chat/completions` writes the head and the role event at once, then one content event per
`POST /step`, then the usage event and `[DONE]` with the last. A request whose body holds `[[stepped:cut]]` is
cut after its first content event (the next step closes the connection instead); one whose body holds
`[[stepped:cut-before-content]]` is cut before it (the first step closes the connection). A marker
`[[stepped:retryN=ok]]` or `[[stepped:retryN=STATUS]]` decides how a miss-path retry is answered (the gateway names
the N-th retry's `x-request-id` `<id>-retryN`): streamed without any cut, or with that status and a JSON error
body. `GET /state` gives the number of chat requests received and of events written, so a test knows where the
stream stands without waiting on a clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re

import uvicorn

from tests.fault_upstream import Receive, Scope, Send, read_body, reply

CUT = "[[stepped:cut]]"
CUT_BEFORE_CONTENT = "[[stepped:cut-before-content]]"
RETRY_NUMBER = re.compile(r"-retry(\d+)$")


def retry_answer(number: int, answer: str) -> str:
    """The marker that makes the `number`-th retry answer `ok` (a whole stream) or with a status (e.g. "429")."""
    return f"[[stepped:retry{number}={answer}]]"


def answer_for(request_id: str, text: str) -> str | None:
    """What the body's markers ask of this request (None: the cut markers decide)."""
    retry = RETRY_NUMBER.search(request_id)
    if retry is None:
        return None
    marker = re.search(r"\[\[stepped:retry" + retry.group(1) + r"=(ok|\d{3})\]\]", text)
    return marker.group(1) if marker else None


def chat_event(delta: dict[str, str], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    chunk = {"id": "chatcmpl-stepped", "object": "chat.completion.chunk", "created": 1, "model": "sim-model",
             "choices": [choice]}
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


USAGE_EVENT = (b'data: {"id":"chatcmpl-stepped","object":"chat.completion.chunk","created":1,"model":"sim-model",'
               b'"choices":[],"usage":{"prompt_tokens":5,"total_tokens":8,"completion_tokens":3}}\n\n')


class SteppedUpstream:
    def __init__(self, tokens: int) -> None:
        self.tokens = tokens
        self.requests = 0
        self.written = 0  # events of the current stream
        self.steps: asyncio.Queue[None] | None = None  # the current stream's; a new one per stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        if scope["path"] == "/step":
            if self.steps is not None:
                self.steps.put_nowait(None)
            await reply(send, 200, b"{}")
        elif scope["path"] == "/state":
            await reply(send, 200, json.dumps({"requests": self.requests, "written": self.written}).encode())
        elif scope["path"] == "/v1/chat/completions":
            self.requests += 1
            self.written = 0
            self.steps = asyncio.Queue()  # steps meant for an earlier stream never reach this one
            text = body.decode("utf-8", "replace")
            headers = dict(scope["headers"])
            answer = answer_for(headers.get(b"x-request-id", b"").decode("latin-1"), text)
            if answer is not None and answer != "ok":
                error = {"error": {"message": "stepped status", "type": "server_error", "code": int(answer)}}
                await reply(send, int(answer), json.dumps(error).encode())
                return
            cut_at = 0 if answer == "ok" else 1 if CUT_BEFORE_CONTENT in text else 2 if CUT in text else 0
            await self._stream(send, cut_at, self.steps)
        else:
            await reply(send, 200, b"")

    async def _stream(self, send: Send, cut_at: int, steps: asyncio.Queue[None]) -> None:
        """The answer; `cut_at` is the step that closes the connection instead of writing (0: none)."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        await self._write(send, chat_event({"role": "assistant", "content": ""}))
        for token in range(1, self.tokens + 1):
            await steps.get()
            if token == cut_at:
                raise ConnectionAbortedError("cutting the stream on purpose")
            if token < self.tokens:
                await self._write(send, chat_event({"content": f"t{token}"}))
            else:
                await self._write(send, chat_event({"content": f"t{token}"}, "length") + USAGE_EVENT
                                  + b"data: [DONE]\n\n")
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _write(self, send: Send, event: bytes) -> None:
        await send({"type": "http.response.body", "body": event, "more_body": True})
        self.written += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=3)
    args = parser.parse_args()
    uvicorn.run(SteppedUpstream(args.tokens), host="127.0.0.1", port=args.port, log_level="critical")


if __name__ == "__main__":
    main()
