"""Prompt-size benchmark: what a larger request body costs the gateway, for 1k to 128k-token prompts.

Four measurements, for bodies of 1k, 8k, 32k and 128k tokens (about 5 bytes per token, as a tokenizer sees English
words) on four routes: `chat` (a system message and one long user message), `chat-turns` (the same tokens as a
conversation of 100 messages, in lines of twelve words), `completions`, and `completions-ids` (the prompt as a list
of token ids, as clients that tokenize for themselves send it: about 7.3 bytes per token); the first, second and
fourth by default, the third alone with `--compare`:

* **Served.** One `kvgate serve` (every feature on, info logging) in front of the fast upstream, requests sent one
  at a time (streaming, as clients do). Per size: the gateway's own `x-kvgate-overhead-ms` header (from the app's
  start, at the end of the request head, to the request leaving for upstream; p50/p90), the gateway process's
  CPU per request (/proc, whole request) and its minor page faults per request (/proc: first touches of fresh
  memory, which a large body costs in copies).
* **The body path's time, in process.** The same body through the shape check, the rewrite and the encoding as
  the proxy runs them, timed in this process (best of several repeats): the gateway's own size-dependent work,
  without the socket reads and without waiting for the client's writes, which the served figure includes.
* **Against direct, nginx and the Rust router** (`--compare`). The fast upstream directly, `kvgate serve`, nginx
  and vllm-router (each where installed, as `loadtests/proxy_overhead.py` runs them, on the proxy core), one
  request to each in turn, sequentially: the TTFT the client sees, and what each proxy adds to the direct TTFT
  at each prompt size. This is the user's view, the same for every proxy: it includes receiving the body and
  sending it on, which the gateway's own header does not.
* **Memory, in process.** tracemalloc around the body path of one request as the proxy runs it — the body
  joined from the client's chunks, its shape check, the rewrite, the client's bytes dropped (a long prompt kept
  as JSON text still points into them), the bytes sent upstream encoded — reported as peak bytes allocated over
  the body size (the chunks themselves, which exist
  before the path begins, are not counted). A served gateway's RSS high-water mark cannot be split per
  request, so this focused figure stands for it.

    .venv/bin/python -m loadtests.prompt_size --out /tmp/prompt-size.json [--requests 60] \
        [--routes chat chat-turns completions completions-ids] [--tokens 1000 8000 32000 128000] \
        [--compare [--router-binary PATH]]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
import uvloop

from gateway.policy.model import TenantPolicy
from gateway.proxy import record as record_module
from gateway.proxy.forward import DEFAULT_JSON_LIMITS
from gateway.proxy.rewrite import rewrite_request
from gateway.proxy.shape import check_json_shape
from gateway.routes import ROUTES
from gateway.salts import Salts
from loadtests import loadgen, procstat
from loadtests import proxy_overhead as bench
from loadtests.loadgen import Target
from loadtests.overhead_report import DIRECT

TOKEN_SIZES = (1_000, 8_000, 32_000, 128_000)
ROUTE_CHOICES = ("chat", "chat-turns", "completions", "completions-ids")
VOCABULARY = 151_936  # token ids are spread over a large tokenizer's range (Qwen's), so most take six digits
CONVERSATION_TURNS = 100  # chat-turns: a long conversation rather than one long message
# The fast upstream's first event in the comparison: short, so its timer adds little spread to the TTFT that
# every target shares (the served measurement reads the gateway's own header and does not depend on it).
COMPARE_TTFT_MS = 1.0
WORDS = ("the", "cache", "of", "a", "block", "is", "kept", "per", "tenant", "and")  # ~4.9 bytes per token
SECRET = b"prompt-size-benchmark-secret-0123456789"
SALTS = Salts(SECRET)
BENCH_TENANT = TenantPolicy.model_validate({"tenant": "bench", "keys": [], "cache": {"isolation": "tenant"}})


@dataclass(frozen=True)
class SizeResult:
    route: str
    tokens: int
    body_bytes: int
    overhead_p50_ms: float
    overhead_p90_ms: float
    body_wait_p50_ms: float | None  # the gateway's wait for the client's upload, left out of the overhead since
    # 2026-12-03 (sixth session); None for a tree that does not log it
    cpu_ms_per_request: float
    faults_per_request: float  # the gateway's minor page faults
    body_path_ms: float
    peak_alloc_bytes: int

    @property
    def peak_over_body(self) -> float:
        return self.peak_alloc_bytes / self.body_bytes


def prompt_text(tokens: int) -> str:
    """About `tokens` tokens of plain words (one word and its space per token)."""
    return " ".join(WORDS[index % len(WORDS)] for index in range(tokens))


def lines_text(tokens: int) -> str:
    """prompt_text in lines of twelve words, as a conversation's messages are written (each line end is a `\\n`
    escape in the JSON text, so the body holds backslashes)."""
    words = prompt_text(tokens).split(" ")
    return "\n".join(" ".join(words[start:start + 12]) for start in range(0, len(words), 12))


def request_body(route: str, tokens: int) -> bytes:
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "stream": True, "temperature": 0,
                            "stream_options": {"include_usage": True}}
    if route == "chat":
        body["messages"] = [{"role": "system", "content": "You answer briefly."},
                            {"role": "user", "content": prompt_text(tokens)}]
    elif route == "chat-turns":  # a conversation: the same tokens in CONVERSATION_TURNS messages of several lines
        turn = max(1, tokens // CONVERSATION_TURNS)
        body["messages"] = [{"role": "user" if index % 2 == 0 else "assistant", "content": lines_text(turn)}
                            for index in range(CONVERSATION_TURNS)]
    elif route == "completions-ids":  # written as Python's json writes a list: ", " between the ids
        body["prompt"] = [(index * 7_919 + 13) % VOCABULARY for index in range(tokens)]
    else:
        body["prompt"] = prompt_text(tokens)
    return json.dumps(body).encode()


def route_path(route: str) -> str:
    return bench.ROUTE_PATHS[{"chat-turns": "chat", "completions-ids": "completions"}.get(route, route)]


def run_body_path(route: str, body: bytes) -> bytes:
    """What the proxy does with a body it holds: the shape check, the rewrite (one validating pass), the encoding."""
    check_json_shape(body, DEFAULT_JSON_LIMITS)
    return rewrite_request(body, ROUTES[route_path(route)], BENCH_TENANT, SALTS, None).body


def body_path_ms(route: str, body: bytes, repeats: int = 7, number: int = 10) -> float:
    """The body path's time per body, the best of `repeats` runs of `number` (the least disturbed)."""
    return min(timeit.repeat(lambda: run_body_path(route, body), number=number, repeat=repeats)) / number * 1000


def body_path_peak(route: str, body: bytes) -> int:
    """Peak bytes allocated while one body goes from the client's chunks to the bytes sent upstream."""
    spec = ROUTES[route_path(route)]
    chunks = [body[start:start + 65536] for start in range(0, len(body), 65536)]  # as uvicorn hands them over
    tracemalloc.start()
    try:
        joined = b"".join(chunks)  # as read_body does; the proxy then drops these bytes before encoding
        check_json_shape(joined, DEFAULT_JSON_LIMITS)
        prepared = rewrite_request(joined, spec, BENCH_TENANT, SALTS, None)
        del joined
        sent = prepared.body
        assert sent
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@dataclass(frozen=True)
class Compared:
    route: str
    tokens: int
    ttft_p50_ms: dict[str, float]  # per target, direct included
    added_p50_ms: dict[str, float]  # per proxy: its TTFT p50 minus the direct one


@dataclass(frozen=True)
class Served:
    overheads_ms: list[float]
    cpu_ms_per_request: float
    faults_per_request: float
    request_ids: list[str]


async def served(url: str, key: str, body: bytes, requests: int, gateway_pid: int) -> Served:
    """Overhead headers of `requests` sequential requests, and the gateway's CPU and minor page faults per
    request."""
    headers = {"content-type": "application/json", "authorization": f"Bearer {key}"}
    overheads: list[float] = []
    request_ids: list[str] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(3):  # warm-up
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
        before, faults_before = procstat.process_cpu_s(gateway_pid), procstat.minor_faults(gateway_pid)
        for _ in range(requests):
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"status {response.status}")
                overheads.append(float(response.headers["x-kvgate-overhead-ms"]))
                request_ids.append(response.headers["x-request-id"])
        used = procstat.process_cpu_s(gateway_pid) - before
        faults = procstat.minor_faults(gateway_pid) - faults_before
    return Served(overheads, used * 1000 / requests, faults / requests, request_ids)


def body_wait_p50(log: Path, request_ids: Sequence[str]) -> float | None:
    """The median `body_wait_ms` of these requests, from the gateway's request log lines (a line without the field:
    no wait, 0); None for a gateway tree from before the field, which counted the wait in its overhead."""
    if "body_wait_s" not in getattr(record_module.Exchange, "__dataclass_fields__", {}):
        return None
    wanted = set(request_ids)
    waits = [float(record.get("body_wait_ms") or 0.0)
             for record in (json.loads(line) for line in log.read_bytes().splitlines()
                            if line.startswith(b"{") and b'"event":"request"' in line)
             if record.get("request_id") in wanted]
    return statistics.median(waits) if waits else None


def measure(config: bench.Config, requests: int, routes: Sequence[str], sizes: Sequence[int]) -> list[SizeResult]:
    results: list[SizeResult] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-prompt-size-") as tmp, \
            bench.start_upstream(config, Path(tmp)) as upstream:
        gateway_cm, key = bench.start_gateway(config, Path(tmp), upstream.url)
        with gateway_cm as gateway:
            procstat.pin_process(gateway.popen.pid, {config.proxy_core})
            for route in routes:
                for tokens in sizes:
                    body = request_body(route, tokens)
                    url = gateway.url + route_path(route)
                    run = uvloop.run(served(url, key, body, requests, gateway.popen.pid))
                    result = SizeResult(route, tokens, len(body), statistics.median(run.overheads_ms),
                                        statistics.quantiles(run.overheads_ms, n=10)[-1],
                                        body_wait_p50(gateway.log_path, run.request_ids), run.cpu_ms_per_request,
                                        run.faults_per_request, body_path_ms(route, body),
                                        body_path_peak(route, body))
                    results.append(result)
                    print(f"  {route:<12} {tokens:>7} tokens {len(body) / 1024:8.1f} KiB  overhead p50 "
                          f"{result.overhead_p50_ms:6.3f} ms  p90 {result.overhead_p90_ms:6.3f} ms  CPU/req "
                          f"{result.cpu_ms_per_request:6.3f} ms  faults/req {result.faults_per_request:5.1f}  "
                          f"body path {result.body_path_ms:6.3f} ms  peak {result.peak_over_body:4.2f}x body",
                          file=sys.stderr, flush=True)
    return results


async def interleaved_ttft(targets: Sequence[Target], requests: int) -> dict[str, list[float]]:
    """TTFT (ms) of `requests` sequential requests to each target, one to each in turn (after a warm-up of three
    each), so that drift on the machine falls on every target alike."""
    ttft: dict[str, list[float]] = {target.name: [] for target in targets}
    async with loadgen.new_session(1) as session:
        for index in range(requests + 3):
            for target in targets:
                sample = await loadgen.one_request(session, target)
                if not sample.ok or sample.ttft_s is None:
                    raise RuntimeError(f"{target.name}: a request failed")
                if index >= 3:
                    ttft[target.name].append(sample.ttft_s * 1000)
    return ttft


def compare(config: bench.Config, requests: int, routes: Sequence[str], sizes: Sequence[int]) -> list[Compared]:
    rows: list[Compared] = []
    with tempfile.TemporaryDirectory(prefix="kvgate-prompt-compare-") as tmp, \
            bench.servers(config, Path(tmp)) as (upstream, proxies, key):
        for route in routes:
            for tokens in sizes:
                body, path = request_body(route, tokens), route_path(route)
                plain = {"content-type": "application/json"}
                targets = [Target(DIRECT, upstream.url + path, plain, body)] + [
                    Target(name, proxy.url + path, {**plain, "authorization": f"Bearer {key}"}, body)
                    for name, proxy in proxies.items()]
                ttft = {name: statistics.median(values)
                        for name, values in uvloop.run(interleaved_ttft(targets, requests)).items()}
                row = Compared(route, tokens, ttft, {name: ttft[name] - ttft[DIRECT] for name in proxies})
                rows.append(row)
                added = "  ".join(f"{name} {value:+.3f}" for name, value in row.added_p50_ms.items())
                print(f"  {route:<12} {tokens:>7} tokens  direct TTFT p50 {ttft[DIRECT]:.3f} ms  added: {added} ms",
                      file=sys.stderr, flush=True)
    return rows


def compare_table(rows: Sequence[Compared]) -> str:
    names = list(rows[0].added_p50_ms)
    lines = ["| route | prompt tokens | direct TTFT p50 | " + " | ".join(f"{name} added | above smallest"
                                                                        for name in names) + " |",
             "|---|---|---|" + "---|---|" * len(names)]
    for row in rows:
        base = min((r for r in rows if r.route == row.route), key=lambda r: r.tokens)
        cells = " | ".join(f"{row.added_p50_ms[name]:+.3f} ms "
                           f"| {row.added_p50_ms[name] - base.added_p50_ms[name]:+.3f} ms" for name in names)
        lines.append(f"| {row.route} | {row.tokens:,} | {row.ttft_p50_ms[DIRECT]:.3f} ms | {cells} |")
    return "\n".join(lines)


def table(results: Sequence[SizeResult]) -> str:
    lines = ["| route | prompt tokens | body | overhead p50 | overhead p90 | above smallest p50 | body wait p50 "
             "| gateway CPU/request | page faults/request | body path (in process) | above smallest "
             "| body-path peak / body |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for result in results:
        base = min((r for r in results if r.route == result.route), key=lambda r: r.tokens)
        wait = "not logged" if result.body_wait_p50_ms is None else f"{result.body_wait_p50_ms:.3f} ms"
        lines.append(f"| {result.route} | {result.tokens:,} | {result.body_bytes / 1024:.0f} KiB "
                     f"| {result.overhead_p50_ms:.3f} ms | {result.overhead_p90_ms:.3f} ms "
                     f"| {result.overhead_p50_ms - base.overhead_p50_ms:+.3f} ms | {wait} "
                     f"| {result.cpu_ms_per_request:.3f} ms "
                     f"| {result.faults_per_request:.1f} | {result.body_path_ms:.3f} ms "
                     f"| {result.body_path_ms - base.body_path_ms:+.3f} ms | {result.peak_over_body:.2f}x |")
    return "\n".join(lines)


def body_path_rounds(routes: Sequence[str], sizes: Sequence[int], rounds: int) -> dict[str, list[float]]:
    """The body path's time (ms) per route and size, `rounds` times each, rounds interleaved over the bodies."""
    bodies = {f"{route} {tokens}": (route, request_body(route, tokens)) for route in routes for tokens in sizes}
    timed: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):
        for name, (route, body) in bodies.items():
            timed[name].append(round(body_path_ms(route, body), 4))
    for name, values in timed.items():
        print(f"  {name:<20} body path median {statistics.median(values):.3f} ms  min {min(values):.3f} ms",
              file=sys.stderr, flush=True)
    return timed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.prompt_size", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--requests", type=int, default=60,
                        help="measured requests per size and route (CPU is read in 10 ms ticks: more is finer)")
    parser.add_argument("--routes", nargs="+", choices=ROUTE_CHOICES, default=list(ROUTE_CHOICES))
    parser.add_argument("--tokens", nargs="+", type=int, default=list(TOKEN_SIZES),
                        help="prompt sizes; 'above smallest' compares each with the smallest measured")
    parser.add_argument("--proxy-core", type=int, default=1)
    parser.add_argument("--bench-core", type=int, default=0)
    parser.add_argument("--compare", action="store_true",
                        help="instead: the TTFT each proxy adds against direct, with nginx and vllm-router where "
                        "installed (--router-binary, else .venv-bench/bin, then PATH)")
    parser.add_argument("--router-binary")
    parser.add_argument("--body-path-only", action="store_true",
                        help="instead: only the body path's time in process, per route and size, `--requests` "
                        "rounds of best-of-7 (no server; a quick A/B of two trees)")
    args = parser.parse_args(argv)
    references = ["--router-binary", args.router_binary] if args.router_binary else []
    compared = ["--ttft-ms", str(COMPARE_TTFT_MS), *references] if args.compare else ["--no-nginx", "--no-router"]
    config = bench.parse_args(["--out", os.devnull, "--tokens", "8", "--proxy-core", str(args.proxy_core),
                               "--bench-core", str(args.bench_core), *compared])
    bench.check_cores(config)
    os.sched_setaffinity(0, {config.bench_core})
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if args.body_path_only:
        timed = body_path_rounds(args.routes, sorted(args.tokens), args.requests)
        args.out.write_text(json.dumps({"machine": machine, "body_path_ms": timed}, indent=2) + "\n")
        print(f"wrote {args.out}")
        return 0
    if args.compare:
        rows = compare(config, args.requests, args.routes, sorted(args.tokens))
        print(compare_table(rows))
        args.out.write_text(json.dumps({"machine": machine, "requests_per_size": args.requests,
                                        "compared": [asdict(row) for row in rows]}, indent=2) + "\n")
        print(f"wrote {args.out}")
        return 0
    results = measure(config, args.requests, args.routes, sorted(args.tokens))
    print(table(results))
    args.out.write_text(json.dumps({
        "machine": machine,
        "requests_per_size": args.requests,
        "results": [{**asdict(result), "peak_over_body": result.peak_over_body} for result in results],
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
