"""What reading one streamed answer costs, by client: kvgate's shadow client (the relay's pooled httptools client in
an instance of its own, its body collected from the read callback), the same client read as the relay reads it
(one `next_chunk` per wake-up), aiohttp, and, where installed (`pip install -e '.[compare]'`), pyreqwest (Rust
reqwest/hyper behind a Python API) with its default and its multi-threaded runtime.

All read the same 64-token SSE streams from the fast upstream (bench core) with `--concurrency` loops in this
process (proxy core) for `--duration` seconds, watching for the first content and collecting the whole answer,
as a shadow arm must. Reported: this process's CPU per answer, for each client in turn.

    .venv/bin/python -m loadtests.shadow_read
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import os
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from gateway.proxy.sse import StreamWatch
from gateway.proxy.upstream import UpstreamClient
from gateway.shadow.client import ShadowClient
from loadtests import proxy_overhead as bench

Reader = Callable[[], Awaitable[bytes]]


async def aiohttp_reader(session: aiohttp.ClientSession, url: str, body: bytes) -> bytes:
    async with session.post(url, data=body, headers={"content-type": "application/json"}) as response:
        watch, captured = StreamWatch(strip_usage=False), bytearray()
        async for chunk in response.content.iter_any():
            captured += chunk
            if watch.feed(chunk)[1]:
                break
        return bytes(captured + await response.read())


async def relay_reader(client: UpstreamClient, base_url: str, path: str, body: bytes) -> bytes:
    """As the relay reads: everything that arrived since the last wake-up, watched for the first content."""
    response = await client.open("POST", base_url, path, {"content-type": "application/json"}, body)
    watch, captured = StreamWatch(strip_usage=False), bytearray()
    while chunk := await response.next_chunk():
        watch.feed(chunk)
        captured += chunk
    response.release()
    return bytes(captured)


async def pyreqwest_reader(client: Any, url: str, body: bytes) -> bytes:
    request = client.post(url).header("content-type", "application/json").body_bytes(body).build_streamed()
    async with request as response:
        reader, watch, captured = response.body_reader, StreamWatch(strip_usage=False), bytearray()
        while (chunk := await reader.read_chunk()) is not None:
            data = bytes(chunk)
            watch.feed(data)
            captured += data
        return bytes(captured)


async def cpu_per_answer(read: Reader, concurrency: int, duration_s: float) -> tuple[int, float]:
    """Answers read and CPU microseconds per answer."""
    await read()
    stop, answers = time.monotonic() + duration_s, 0

    async def loop() -> None:
        nonlocal answers
        while time.monotonic() < stop:
            await read()
            answers += 1

    started = time.process_time()
    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(loop())
    return answers, (time.process_time() - started) / answers * 1e6


async def measure(base_url: str, path: str, body: bytes, concurrency: int,
                  duration_s: float) -> dict[str, tuple[int, float]]:
    headers = {"content-type": "application/json"}
    url = base_url + path
    shadow = ShadowClient(UpstreamClient(connections=concurrency, connect_timeout_s=5, read_timeout_s=60))
    relay = UpstreamClient(connections=concurrency, connect_timeout_s=5, read_timeout_s=60)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        results = {
            "aiohttp": await cpu_per_answer(lambda: aiohttp_reader(session, url, body), concurrency, duration_s),
            "shadow client": await cpu_per_answer(
                lambda: _shadow_body(shadow, base_url, path, headers, body), concurrency, duration_s),
            "relay client": await cpu_per_answer(lambda: relay_reader(relay, base_url, path, body), concurrency,
                                                 duration_s),
        }
    shadow.close()
    relay.close()
    if importlib.util.find_spec("pyreqwest") is not None:
        builder = importlib.import_module("pyreqwest.client").ClientBuilder
        for name, threaded in (("pyreqwest", False), ("pyreqwest (mt)", True)):
            async with builder().runtime_multithreaded(threaded).max_connections(concurrency).build() as client:
                results[name] = await cpu_per_answer(lambda: pyreqwest_reader(client, url, body), concurrency,
                                                     duration_s)
    return results


async def _shadow_body(client: ShadowClient, base_url: str, path: str, headers: dict[str, str],
                       body: bytes) -> bytes:
    return (await client.post(base_url, path, headers, body, watch_content=True)).body


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.shadow_read", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args(argv)
    config = bench.parse_args(["--out", os.devnull, "--no-nginx"])
    bench.check_cores(config)
    os.sched_setaffinity(0, {config.bench_core})  # the upstream inherits the bench core
    with tempfile.TemporaryDirectory(prefix="kvgate-shadow-read-") as tmp, \
            bench.start_upstream(config, Path(tmp)) as upstream:
        os.sched_setaffinity(0, {config.proxy_core})
        path = bench.ROUTE_PATHS[config.route]
        results = uvloop.run(measure(upstream.url, path, bench.request_body(config), args.concurrency,
                                     args.duration))
    for name, (answers, micros) in results.items():
        print(f"{name:<15} {answers:6d} answers  {micros:6.0f} µs CPU per answer")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
