"""Drive the simulator's real engine in-process: requests parsed by the real parser, a real metrics registry, and
(for KV events) the real publisher on ipc:// sockets read back through its own replay endpoint."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine, Run
from gateway.sim.kv_events import Event
from gateway.sim.protocol import GenRequest, Kind, ParseContext, parse_generation
from gateway.sim.publisher import END_SEQ, KvEventPublisher
from gateway.sim.state import SimState

QUIET = SimConfig(base_ttft_ms=0.0, prefill_us_per_token=0.0, cached_us_per_token=0.0, decode_ms_per_token=0.0,
                  load_us_per_token=0.0, max_model_len=1 << 20)
"""A server whose prefills take no time (the TTFT model is checked on `Run.prefill_s`, never by waiting)."""


def settings(**overrides: Any) -> SimConfig:
    return replace(QUIET, **overrides)


def request(config: SimConfig, prompt: Sequence[int] | str, *, kind: Kind = Kind.COMPLETION,
            **body: Any) -> GenRequest:
    """A request as the server's parser builds it (a completion of `prompt` unless `body` says otherwise)."""
    fields: dict[str, Any] = {"max_tokens": 1, **body}
    if kind is Kind.COMPLETION:
        fields["prompt"] = prompt if isinstance(prompt, str) else list(prompt)
    context = ParseContext(config.model, config.max_model_len, config.max_tokens_default, "unit", config.offload)
    return parse_generation(kind, fields, context)


async def serve(engine: Engine, generation: GenRequest, output: Sequence[int] = (), reason: str = "length") -> Run:
    """One request through the engine: prefill, then finish with `output` as its generated tokens."""
    run = await engine.prefill(generation, time.monotonic())
    engine.finish(run, output, reason)
    return run


def tokens(count: int, start: int) -> list[int]:
    """`count` distinct token ids from `start` (ids above 258 have no text, so no directive can appear)."""
    return list(range(start, start + count))


def samples(state: SimState, families: Sequence[str]) -> dict[str, float]:
    """The current samples of `families`, keyed as Prometheus prints them (labels sorted by name)."""
    out: dict[str, float] = {}
    for metric in state.metrics.registry.collect():
        for sample in metric.samples:
            if sample.name in families:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
                out[f"{sample.name}{{{labels}}}"] = sample.value
    return out


@dataclass(frozen=True)
class Batch:
    seq: int
    ts: float
    events: list[Event]


class Published:
    """A simulator state whose KV-event publisher runs on ipc:// sockets in a private directory."""

    def __init__(self, state: SimState, replay_endpoint: str) -> None:
        self.state = state
        self.replay_endpoint = replay_endpoint

    @property
    def engine(self) -> Engine:
        return self.state.engine

    @property
    def publisher(self) -> KvEventPublisher:
        assert self.state.publisher is not None
        return self.state.publisher

    async def drained(self, timeout_s: float = 10.0) -> None:
        """Wait until every batch handed to the publisher has been sent (polling, with a deadline)."""
        deadline = time.monotonic() + timeout_s
        while self.publisher.next_seq < self.publisher.enqueued:
            if time.monotonic() > deadline:
                raise TimeoutError("the publisher did not send its queue")
            await asyncio.sleep(0.001)

    async def replay(self, start: int = 0) -> list[list[bytes]]:
        """The raw replies of the replay endpoint to a request for batches from `start`, end marker included."""
        context = zmq.asyncio.Context()
        dealer = context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(self.replay_endpoint)
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            replies: list[list[bytes]] = []
            while True:
                frames = await asyncio.wait_for(dealer.recv_multipart(), 10.0)
                replies.append(frames)
                if END_SEQ in frames:
                    return replies
        finally:
            dealer.close(linger=0)
            context.term()

    async def batches(self, start: int = 0) -> list[Batch]:
        """Every batch sent so far from `start`, decoded (read back through the replay endpoint)."""
        await self.drained()
        out: list[Batch] = []
        for frames in (await self.replay(start))[:-1]:
            seq, payload = frames[-2], frames[-1]
            ts, events, rank = msgspec.msgpack.decode(payload)
            assert rank == 0
            out.append(Batch(int.from_bytes(seq, "big"), ts, events))
        return out


@asynccontextmanager
async def published(config: SimConfig) -> AsyncIterator[Published]:
    """`config` with KV events on private ipc:// endpoints; the publisher runs until the block exits."""
    with tempfile.TemporaryDirectory(prefix="kvsim") as folder:
        base = Path(folder)
        events_config = replace(config, kv_events_endpoint=f"ipc://{base / 'pub'}",
                                kv_events_replay_endpoint=f"ipc://{base / 'replay'}", kv_events_topic="kv")
        state = SimState.build(events_config)
        assert state.publisher is not None
        state.publisher.open()
        async with asyncio.TaskGroup() as group:
            group.create_task(state.publisher.run())
            try:
                yield Published(state, f"ipc://{base / 'replay'}")
            finally:
                state.publisher.stop()
