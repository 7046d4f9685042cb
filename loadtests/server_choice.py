"""Which HTTP server can bound what a client sends before the app runs? A short measurement of candidate
servers on one tiny ASGI app (200 with a small JSON body):

* a 10 MB request header: bytes the server took before refusing, its answer, and its RSS growth;
* a slow request head (one header byte per second): seconds until the server closes it (20 s cap);
* an idle connection that never sends a byte: seconds until the server closes it (20 s cap);
* CPU per request: 4,000 keep-alive GETs at c=16 (aiohttp), the server's utime+stime ÷ requests.

Candidates: uvicorn + httptools as shipped, uvicorn + h11 with `h11_max_incomplete_event_size`, uvicorn +
httptools with kvgate's guarded protocol (gateway/limits/connections.py), hypercorn (h11) and granian. The last
two are not kvgate dependencies: `.venv/bin/pip install granian hypercorn` first (missing ones are skipped).

    .venv/bin/python -m loadtests.server_choice --out loadtests/reports/hardening-2026-12-01/server_choice.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import socket
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn
from prometheus_client import CollectorRegistry, Counter

from gateway.devtools.localproc import free_port, run_server
from gateway.limits.connections import ConnectionLimits, guarded_protocol
from loadtests import procstat
from loadtests.hardening_stack import importable_here
from loadtests.results import write_json

Message = MutableMapping[str, Any]
BODY = b'{"ok":true}'
CAP_S = 20.0
HEADER_BYTES = 10 * 1024 * 1024
LIMIT_BYTES = 16 * 1024
REQUESTS = 4000
CONCURRENCY = 16


async def app(scope: Message, receive: Callable[[], Awaitable[Message]], send: Callable[[Message], Awaitable[None]]) \
        -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": f"{message['type']}.complete"})
            if message["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY})


def serve_guarded(port: int) -> None:
    limits = ConnectionLimits(LIMIT_BYTES, header_timeout_s=10.0, idle_timeout_s=15.0, max_connections=4096)
    counter = Counter("closed", "closed connections", ["reason"], registry=CollectorRegistry())
    config = uvicorn.Config(app, host="127.0.0.1", port=port, loop="uvloop", http=guarded_protocol(limits, counter),
                            ws="none", lifespan="on", log_level="warning", access_log=False)
    uvicorn.Server(config).run()


def candidates(port: int) -> dict[str, list[str]]:
    py = sys.executable
    target = "loadtests.server_choice:app"
    found = {
        "uvicorn-httptools": [py, "-m", "uvicorn", target, "--port", str(port), "--http", "httptools", "--loop",
                              "uvloop", "--log-level", "warning", "--no-access-log"],
        "uvicorn-h11-limit": [py, "-m", "uvicorn", target, "--port", str(port), "--http", "h11", "--loop", "uvloop",
                              "--h11-max-incomplete-event-size", str(LIMIT_BYTES), "--log-level", "warning",
                              "--no-access-log"],
        "uvicorn-httptools-guarded": [py, "-m", "loadtests.server_choice", "--serve-guarded", str(port)],
    }
    if shutil.which("hypercorn", path=str(Path(py).parent)):
        found["hypercorn"] = [py, "-m", "hypercorn", target, "--bind", f"127.0.0.1:{port}", "-k", "uvloop",
                              "--read-timeout", "10", "--keep-alive", "15"]
    if shutil.which("granian", path=str(Path(py).parent)):
        found["granian"] = [str(Path(py).parent / "granian"), "--interface", "asgi", "--host", "127.0.0.1",
                            "--port", str(port), "--http", "1", "--loop", "uvloop", "--workers", "1",
                            "--http1-header-read-timeout", "10000", "--log-level", "warning", target]
    return found


def status_of(raw: bytes) -> int | None:
    if raw.startswith(b"HTTP/1."):
        return int(raw.split(b" ", 2)[1])
    return None


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a server and its workers (hypercorn and granian serve from child processes)."""
    return sum(procstat.process_cpu_s(member) for member in procstat.process_tree(pid))


def tree_rss(pid: int) -> int:
    return sum(procstat.rss_bytes(member) for member in procstat.process_tree(pid))


def big_header(port: int, pid: int) -> dict[str, Any]:
    before = tree_rss(pid)
    sent, peak = 0, before
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        try:
            while sent < HEADER_BYTES:
                sock.sendall(b"a" * 65536)
                sent += 65536
                peak = max(peak, tree_rss(pid))
        except OSError:  # refused and closed, or the server stopped reading (send timed out)
            pass
        peak = max(peak, tree_rss(pid))
        answer = read_some(sock)
    return {"bytes_sent_before_refusal": sent, "status": status_of(answer),
            "rss_growth_mib": round((peak - before) / 2**20, 1)}


def read_some(sock: socket.socket) -> bytes:
    sock.settimeout(3.0)
    try:
        return sock.recv(4096)
    except OSError:
        return b""


def seconds_until_closed(port: int, trickle: bool) -> dict[str, Any]:
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=CAP_S) as sock:
        if trickle:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.settimeout(1.0)
        answer = b""
        while time.monotonic() - started < CAP_S:
            try:
                if trickle:
                    sock.sendall(b"a")
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
        else:
            return {"closed_after_s": None, "status": None, "note": f"still open after {CAP_S:.0f} s"}
    return {"closed_after_s": round(time.monotonic() - started, 1), "status": status_of(answer)}


async def cpu_per_request(url: str, pid: int) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one() -> None:
            async with session.get(url) as response:
                await response.read()

        for _ in range(200):  # warm-up
            await one()
        queue = iter(range(REQUESTS))

        async def worker() -> None:
            for _ in queue:
                await one()

        cpu_before, started = tree_cpu_s(pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        elapsed, cpu = time.perf_counter() - started, tree_cpu_s(pid) - cpu_before
    return {"cpu_us_per_request": round(cpu / REQUESTS * 1e6, 1), "requests_per_s": round(REQUESTS / elapsed)}


def measure(name: str, argv: list[str], port: int, work: Path) -> dict[str, Any]:
    with run_server(argv, port, work / f"{name}.log", env=importable_here(), ready_path="/") as server:
        pid = server.popen.pid
        result: dict[str, Any] = {"server": name}
        result["cpu"] = asyncio.run(cpu_per_request(f"{server.url}/", pid))
        result["header_10mb"] = big_header(port, pid)
        result["slow_head"] = seconds_until_closed(port, trickle=True)
        result["idle"] = seconds_until_closed(port, trickle=False)
        result["rss_after_mib"] = round(tree_rss(pid) / 2**20, 1)
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.server_choice", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvgate-server-choice"))
    parser.add_argument("--serve-guarded", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_guarded:
        serve_guarded(args.serve_guarded)
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    results = []
    for name in candidates(0):
        port = free_port()
        results.append(measure(name, candidates(port)[name], port, args.work))
        print(json.dumps(results[-1]), flush=True)
    if args.out:
        write_json({"limit_bytes": LIMIT_BYTES, "results": results}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
