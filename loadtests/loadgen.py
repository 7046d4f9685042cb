"""Closed-loop streaming load generator on aiohttp (C HTTP parser).

`concurrency` workers each send one streaming request after another over kept-alive connections. A
request's TTFT is taken when the first `data:` event carrying generated text arrives; it is complete when
the stream ends with `data: [DONE]`. Measurement covers a fixed window after a warm-up; a caller-given
snapshot function runs at both ends of the window (e.g. to read /proc CPU counters).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import aiohttp

# An event with at least one character of generated text (completions `text`, chat `content`).
TEXT_EVENT = re.compile(rb'"(?:text|content)":"[^"]')
DONE_TAIL = b"data: [DONE]\n\n"
EVENT_MARK = b"data:"
REQUEST_TIMEOUT_S = 60.0
Snap = TypeVar("Snap")


@dataclass(frozen=True)
class Target:
    """One streaming request, sent again and again."""

    name: str
    url: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class Sample:
    started: float  # time.perf_counter()
    finished: float
    ttft_s: float | None
    ok: bool
    events: int


@dataclass(frozen=True)
class Timed(Generic[Snap]):
    at: float
    value: Snap


@dataclass(frozen=True)
class PhaseRun(Generic[Snap]):
    samples: list[Sample]
    start: Timed[Snap]
    end: Timed[Snap]


@dataclass(frozen=True)
class PhaseStats:
    window_s: float
    completed: int  # requests that finished inside the window
    errors: int  # failed requests that started or finished inside the window
    requests_per_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_samples: int  # successful requests that started inside the window
    events_per_request: float


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of `values`; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def new_session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=0, keepalive_timeout=60.0)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 skip_auto_headers=("User-Agent",))


async def one_request(session: aiohttp.ClientSession, target: Target) -> Sample:
    started = time.perf_counter()
    ttft_s: float | None = None
    chunks: list[bytes] = []
    status = 0
    try:
        async with session.post(target.url, data=target.body, headers=target.headers) as response:
            status = response.status
            async for chunk in response.content.iter_any():
                if ttft_s is None and TEXT_EVENT.search(chunk) is not None:
                    ttft_s = time.perf_counter() - started
                chunks.append(chunk)
    except (aiohttp.ClientError, TimeoutError):
        return Sample(started, time.perf_counter(), ttft_s, ok=False, events=0)
    body = b"".join(chunks)
    ok = status == 200 and body.endswith(DONE_TAIL) and ttft_s is not None
    return Sample(started, time.perf_counter(), ttft_s, ok=ok, events=body.count(EVENT_MARK))


async def worker(
    session: aiohttp.ClientSession, target: Target, delay_s: float, stop_at: float, samples: list[Sample]
) -> None:
    await asyncio.sleep(delay_s)  # spreads the workers' start so streams do not move in lockstep
    while time.perf_counter() < stop_at:
        samples.append(await one_request(session, target))


async def snapshot_at(when: float, snapshot: Callable[[], Snap]) -> Timed[Snap]:
    await asyncio.sleep(max(0.0, when - time.perf_counter()))
    return Timed(time.perf_counter(), snapshot())


async def run_phase(
    target: Target | Sequence[Target], concurrency: int, warmup_s: float, duration_s: float, spread_s: float,
    snapshot: Callable[[], Snap],
) -> PhaseRun[Snap]:
    """Run `concurrency` workers for warm-up + window; new requests stop at the window's end. With several
    targets, worker i sends target i modulo their number (e.g. one prompt per stream)."""
    targets = [target] if isinstance(target, Target) else list(target)
    samples: list[Sample] = []
    window_start = time.perf_counter() + warmup_s
    window_end = window_start + duration_s
    async with new_session(concurrency) as session, asyncio.TaskGroup() as group:
        for index in range(concurrency):
            delay_s = spread_s * index / concurrency
            group.create_task(worker(session, targets[index % len(targets)], delay_s, window_end, samples))
        start = await snapshot_at(window_start, snapshot)
        end = await snapshot_at(window_end, snapshot)
    return PhaseRun(samples, start, end)


def summarize(samples: Sequence[Sample], start: float, end: float) -> PhaseStats:
    window_s = end - start
    finished = [sample for sample in samples if sample.ok and start <= sample.finished < end]
    started = [sample for sample in samples if sample.ok and start <= sample.started < end]
    errors = sum(1 for s in samples if not s.ok and (start <= s.started < end or start <= s.finished < end))
    ttfts = [sample.ttft_s * 1000 for sample in started if sample.ttft_s is not None]
    events = [sample.events for sample in finished]
    return PhaseStats(
        window_s=window_s,
        completed=len(finished),
        errors=errors,
        requests_per_s=len(finished) / window_s,
        ttft_p50_ms=percentile(ttfts, 50),
        ttft_p99_ms=percentile(ttfts, 99),
        ttft_samples=len(ttfts),
        events_per_request=sum(events) / len(events) if events else math.nan,
    )
