"""What the last stage of every request costs in-process: its metrics and its log line (gateway/proxy/record.py).

Times, per request, with the log written as a served gateway writes it (JSON, info level) to /dev/null:

- `record`: `RequestRecorder.record` as the app calls it (cached labelled children, per-second timestamp text);
- `record, labels() per request`: the same metrics looked up with `labels()` every time (what the cache saves);
- `timestamp, cached` against `timestamp, structlog TimeStamper`: the log line's ISO UTC stamp alone.

End to end these are a few µs of a streamed request's ~1.2 ms (loadtests/proxy_overhead.py cannot resolve them on
a shared box), so they are measured here. Run:

    .venv/bin/python -m loadtests.request_record_cost [--requests 20000] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

import structlog
from prometheus_client import CollectorRegistry

from gateway.log import UtcIsoStamper, configure_logging, get_logger
from gateway.metrics import GatewayMetrics
from gateway.proxy.record import REQUEST_LOGGER, Exchange, RequestRecorder, log_fields
from gateway.proxy.sse import Usage

REPEATS = 5


def per_call_us(work: Callable[[], object], number: int) -> float:
    """The best of REPEATS timings, in µs per call (the least disturbed by other processes)."""
    return min(timeit.repeat(work, number=number, repeat=REPEATS)) / number * 1e6


def sample_exchange() -> Exchange:
    return Exchange("0123456789abcdef0123456789abcdef", "chat", 0.0, tenant="bench", pool="bench",
                    upstream="http://127.0.0.1:9000", status=200, overhead_s=0.0001, ttft_s=0.02, duration_s=0.15,
                    usage=Usage(prompt_tokens=100, cached_tokens=0, completion_tokens=64), policy_version="v1")


def uncached_record(metrics: GatewayMetrics, exchange: Exchange) -> None:
    """The record stage as it was before the cache: every child looked up with `labels()`."""
    tenant, pool, route = exchange.tenant, exchange.pool, exchange.route
    metrics.requests.labels(tenant, pool, route, str(exchange.status)).inc()
    metrics.duration.labels(tenant, pool, route).observe(exchange.duration_s)
    if exchange.ttft_s is not None:
        metrics.ttft.labels(tenant, pool, route).observe(exchange.ttft_s)
    if exchange.usage is not None:
        metrics.prompt_tokens.labels(tenant, pool).inc(exchange.usage.prompt_tokens)
        metrics.cached_prompt_tokens.labels(tenant, pool).inc(exchange.usage.cached_tokens)
    metrics.overhead.labels(route).observe(exchange.overhead_s)
    get_logger(REQUEST_LOGGER).info("request", **log_fields(exchange))  # through structlog, as it was


def measure(requests: int) -> dict[str, float]:
    metrics = GatewayMetrics(CollectorRegistry())
    recorder = RequestRecorder(metrics)
    exchange = sample_exchange()
    cached, structlogs = UtcIsoStamper(), structlog.processors.TimeStamper(fmt="iso", utc=True)
    return {
        "record_us": per_call_us(lambda: recorder.record(exchange), requests),
        "record_labels_per_request_us": per_call_us(lambda: uncached_record(metrics, exchange), requests),
        "timestamp_cached_us": per_call_us(lambda: cached(None, "info", {}), requests * 5),
        "timestamp_structlog_us": per_call_us(lambda: structlogs(None, "info", {}), requests * 5),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    report = sys.stdout
    with open(os.devnull, "w") as devnull:
        sys.stderr = devnull  # the log lines go where a served gateway's would, but nowhere to read
        configure_logging("json", "info")
        results = measure(args.requests)
    sys.stderr = sys.__stderr__
    for name, value in results.items():
        print(f"{name:32} {value:8.2f} µs", file=report)
    if args.out is not None:
        args.out.write_text(json.dumps({"requests": args.requests, "repeats": REPEATS, **results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
