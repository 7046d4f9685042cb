"""Per-event CPU cost of the gateway's SSE scan on captured vLLM streams.

    .venv/bin/python -m loadtests.sse_scan_bench [--rounds 15] [--repeat 300] [--json OUT]

Each captured stream (tests/fixtures/vllm-0.25.0/http/*.sse.txt) is fed one event per chunk, as vLLM sends
it, through `StreamWatch` (the relay's per-chunk work, with and without usage stripping), and read whole by
`stream_usage` and `generated_text` (the shadow arm's work). "captured" is the streams as recorded (5-8
events each, so per-stream work dominates); "long" repeats their token events to 256 per stream, the steady
state. Figures are the best of `--rounds` rounds, in nanoseconds per event, of CPU time of this process
(`time.process_time_ns`), so other processes on a shared box disturb them less; the best round is the least
disturbed.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

from gateway.proxy.sse import StreamWatch, stream_usage
from gateway.shadow.compare import generated_text
from loadtests.results import print_and_write_json

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "vllm-0.25.0" / "http"


def captured_events() -> list[list[bytes]]:
    """Every captured stream, split into its events (each with its blank line)."""
    streams = []
    for path in sorted(FIXTURES.glob("*.sse.txt")):
        body = path.read_bytes().split(b"\n\n", 1)[1]
        streams.append([event + b"\n\n" for event in body.split(b"\n\n") if event.strip()])
    return streams


def lengthened(streams: list[list[bytes]], tokens: int) -> list[list[bytes]]:
    """Each stream with its token events repeated to `tokens` events: the steady state of a long answer."""
    longer = []
    for events in streams:
        head, middle, tail = events[:1], events[1:-2], events[-2:]
        longer.append(head + [middle[i % len(middle)] for i in range(tokens)] + tail)
    return longer


def relay(streams: list[list[bytes]], strip: bool) -> Callable[[], None]:
    def run() -> None:
        for events in streams:
            watch = StreamWatch(strip_usage=strip)
            for event in events:
                watch.feed(event)
            watch.flush()
    return run


def whole(streams: list[list[bytes]]) -> Callable[[], None]:
    bodies = [b"".join(events) for events in streams]

    def run() -> None:
        for body in bodies:
            stream_usage(body)
            generated_text(body)
    return run


def best_ns_per_event(run: Callable[[], None], events: int, rounds: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time_ns()
        for _ in range(repeat):
            run()
        best = min(best, (time.process_time_ns() - started) / (repeat * events))
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    report: dict[str, object] = {"python": platform.python_version()}
    for label, streams in (("captured", captured_events()), ("long", lengthened(captured_events(), 256))):
        events = sum(len(stream) for stream in streams)
        repeat = max(1, args.repeat * 32 // events)
        report[label] = {
            "streams": len(streams), "events": events,
            "relay_ns_per_event": round(best_ns_per_event(relay(streams, False), events, args.rounds, repeat), 1),
            "relay_strip_ns_per_event": round(best_ns_per_event(relay(streams, True), events, args.rounds, repeat), 1),
            "whole_stream_ns_per_event": round(best_ns_per_event(whole(streams), events, args.rounds, repeat), 1),
        }
    print_and_write_json(report, args.json)


if __name__ == "__main__":
    main()
