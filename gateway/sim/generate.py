"""The life of one generation request: validate, wait for the engine, decode, answer (or stop when the
client goes away), and leave a record of it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence

from gateway.sim import tokenizer
from gateway.sim.asgi import JSON, HttpRequest, Send, StreamWriter, encode_json, run_until_disconnect, send_json
from gateway.sim.engine import LoadFailed, Run
from gateway.sim.errors import SimError
from gateway.sim.formats import SSE_MEDIA_TYPE, ResponseMeta, StreamFormat, Usage, body_for, chunk_stream
from gateway.sim.protocol import GenRequest, Kind, ParseContext, decode_json, parse_generation
from gateway.sim.recorder import RequestRecord
from gateway.sim.responses_api import ResponsesStream, response_body
from gateway.sim.state import SimState

LOAD_FAILED_MESSAGE = "Simulated KV load failure (kv_load_failure_policy=fail)."
_MEDIA_ERROR = SimError(400, "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
                        "Bad Request")


def require_json(request: HttpRequest) -> None:
    """vLLM's `validate_json_request`: the media type must be application/json."""
    if request.headers.get("content-type", "").lower().split(";", 1)[0].strip() != JSON:
        raise _MEDIA_ERROR


def base_request_id(request: HttpRequest) -> str:
    """The `X-Request-Id` when sent (vLLM uses it as is), else a random 16-hex id like vLLM's."""
    return request.headers.get("x-request-id") or secrets.token_hex(8)


async def read_generation(state: SimState, kind: Kind, request: HttpRequest, record: RequestRecord) -> GenRequest:
    require_json(request)
    body = decode_json(await request.body())
    record.note_body(body)
    config = state.config
    context = ParseContext(config.model, config.max_model_len, config.max_tokens_default,
                           base_request_id(request), config.offload)
    return parse_generation(kind, body, context)


def response_headers(state: SimState, request: HttpRequest) -> list[tuple[bytes, bytes]]:
    if not state.config.enable_request_id_headers:
        return []
    return [(b"x-request-id", (request.headers.get("x-request-id") or secrets.token_hex(16)).encode())]


async def serve_generation(state: SimState, kind: Kind, request: HttpRequest, send: Send,
                           record: RequestRecord) -> None:
    """Route handler shared by completions, chat, responses and /invocations."""
    arrival = time.monotonic()
    try:
        generation = await read_generation(state, kind, request, record)
    except SimError as error:
        await send_json(send, error.status, error.body)
        record.finish(error.status)
        return
    job = GenerationJob(state, generation, send, arrival, response_headers(state, request))
    state.in_flight += 1
    try:
        ended = await run_until_disconnect(request.receive, job.run())
    except asyncio.CancelledError:
        record.finish(job.status, "aborted")
        raise
    except Exception:
        record.finish(500, "failed")
        raise
    finally:
        state.in_flight -= 1
    job.report(record, ended)


class GenerationJob:
    """Runs one validated request against the engine and writes its reply."""

    def __init__(self, state: SimState, request: GenRequest, send: Send, arrival: float,
                 headers: list[tuple[bytes, bytes]]) -> None:
        self.state = state
        self.request = request
        self.arrival = arrival
        self.headers = headers
        self.send = send
        self.writer = StreamWriter(send)
        self.meta = ResponseMeta(request, int(time.time()), state.fingerprint)
        self.status = 200
        self.outcome = "completed"
        self.emitted = 0
        self.usage: Usage | None = None
        self.run_state: Run | None = None

    def report(self, record: RequestRecord, ended: bool) -> None:
        record.finish(self.status, self.outcome if ended else "aborted")
        record.prompt_tokens = len(self.request.prompt)
        record.completion_tokens = self.emitted
        if self.run_state is not None:
            record.note_prefill(self.run_state.gpu_hit, self.run_state.loaded, self.run_state.prefill_s)

    async def run(self) -> None:
        directives = self.request.directives
        if directives.status is not None:
            await self._fail(SimError(directives.status, f"Simulated failure (status {directives.status})."))
            return
        if directives.hang:
            await asyncio.Event().wait()
        fmt = self._stream_format() if self.request.stream else None
        if fmt is not None:
            await self.writer.start(200, SSE_MEDIA_TYPE, self.headers)
            await self.writer.write(fmt.opening())
        if directives.delay_ms:
            await asyncio.sleep(directives.delay_ms / 1e3)
        try:
            run = await self.state.engine.prefill(self.request, self.arrival)
        except LoadFailed:
            await self._load_failed(fmt)
            return
        await self._generate(run, fmt)

    async def _load_failed(self, fmt: StreamFormat | None) -> None:
        """vLLM with kv_load_failure_policy `fail`: the request errors before its first token."""
        self.outcome = "load_failed"
        if fmt is None:
            await self._fail(SimError(500, LOAD_FAILED_MESSAGE))
        else:
            await self.writer.end(fmt.error(LOAD_FAILED_MESSAGE))

    async def _fail(self, error: SimError) -> None:
        self.status = error.status
        await send_json(self.send, error.status, error.body, self.headers)

    def _stream_format(self) -> StreamFormat:
        return ResponsesStream(self.meta) if self.request.kind is Kind.RESPONSES else chunk_stream(self.meta)

    async def _generate(self, run: Run, fmt: StreamFormat | None) -> None:
        self.run_state = run
        request = self.request
        output = self.state.generator.tokens(request.prompt, request.max_tokens, request.temperature, request.seed)
        self.usage = Usage(len(request.prompt), len(output), run.cached_tokens)
        reason = "abort"
        try:
            reason = await (self._stream(fmt, output) if fmt is not None else self._reply(output))
        finally:
            self.state.engine.finish(run, output[: self.emitted], reason)

    @property
    def _decode_s(self) -> float:
        return self.state.config.decode_ms_per_token / 1e3

    async def _stream(self, fmt: StreamFormat, output: Sequence[int]) -> str:
        """Token events one decode step apart; returns the finish reason."""
        directives = self.request.directives
        await self.writer.write(fmt.first())
        for index, token in enumerate(output):
            if index:
                await asyncio.sleep(self._decode_s)
                self.state.metrics.itl.observe(self._decode_s)
            if index == directives.drop_after:
                self.outcome = "dropped"
                return "abort"
            if index == directives.error_after:
                await self.writer.end(fmt.error("Simulated mid-stream failure."))
                return "error"
            await self.writer.write(fmt.token(tokenizer.token_text(token), index == len(output) - 1))
            self.emitted = index + 1
        assert self.usage is not None
        await self.writer.end(fmt.closing(self.usage, tokenizer.decode(output)))
        return "length"

    async def _reply(self, output: Sequence[int]) -> str:
        """The whole answer after the decode time of all its tokens; returns the finish reason."""
        directives = self.request.directives
        await asyncio.sleep(self._decode_s * (len(output) - 1))
        if directives.error_after is not None:
            await self._fail(SimError(500, "Simulated generation failure."))
            return "error"
        self.emitted = len(output)
        body = encode_json(self._body(tokenizer.decode(output)))
        if directives.drop_after is not None:
            await self._send_truncated(body)
            return "abort"
        await self.writer.start(200, JSON, self.headers)
        await self.writer.end(body)
        return "length"

    def _body(self, text: str) -> dict[str, object]:
        assert self.usage is not None
        if self.request.kind is Kind.RESPONSES:
            return response_body(self.meta, text, self.usage)
        return body_for(self.meta, text, self.usage)

    async def _send_truncated(self, body: bytes) -> None:
        """Headers promising the whole body, half of it, then nothing: the server closes the connection."""
        self.outcome = "dropped"
        length = (b"content-length", str(len(body)).encode())
        await self.writer.start(200, JSON, [*self.headers, length])
        await self.writer.write(body[: len(body) // 2])
