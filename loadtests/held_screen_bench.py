"""What the gateway's stream screens cost when an upstream drips a stream a few bytes per read.

    .venv/bin/python -m loadtests.held_screen_bench [--json OUT]

A tenant with `offload.miss_path: retry` has each stream held until its first content, an error event, or 64 KiB
(`gateway.proxy.misspath.PEEK_LIMIT_BYTES`). This screen runs on the gateway's event loop, so its worst case is
time every other request waits. Each pattern below feeds 64 KiB without content, one piece per read, as an
upstream writing that way would, into:
- `screen`: `HeldBack.screen`, the gateway's (OutcomeScreen: each event read once, when it is complete);
- `rescan`: `first_outcome` of everything read so far after each read, which is what the screen did until
  2026-12-03 (every event read again at every read); `--no-rescan` leaves it out;
- `watch`: the relay's own scan of every stream (`StreamWatch`, usage stripped), fed 256 KiB the same way. Until
  2026-12-03 an event that was not complete yet was copied and searched again at every read.

Seconds of CPU time of this process (`time.process_time`), one run each. Run from an earlier tree
(`PYTHONPATH=TREE`) to time its code: the `screen` and `watch` columns are whatever that tree has.
"""

from __future__ import annotations

import argparse
import platform
import time
from collections.abc import Callable
from pathlib import Path

from gateway.proxy.misspath import PEEK_LIMIT_BYTES, HeldBack
from gateway.proxy.sse import StreamWatch, first_outcome
from loadtests.results import write_json

PATTERNS: dict[str, bytes] = {
    "ten-byte events": b"data: {}\n\n",
    "role events": b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
    "one byte, no line end": b"x",
    "one byte, CR line ends": b"\r",
}


def with_screen(piece: bytes) -> int:
    held, reads = HeldBack(), 0
    while True:
        reads += 1
        if held.screen(piece) is not None:
            return reads


def with_rescan(piece: bytes) -> int:
    region, reads = b"", 0
    while len(region) <= PEEK_LIMIT_BYTES:
        region += piece
        reads += 1
        if first_outcome(region) is not None:
            break
    return reads


WATCH_BYTES = 256 * 1024


def with_watch(piece: bytes) -> int:
    watch, reads = StreamWatch(strip_usage=True), WATCH_BYTES // len(piece)
    for _ in range(reads):
        watch.feed(piece)
    return reads


def timed(run: Callable[[bytes], int], piece: bytes) -> tuple[int, float]:
    started = time.process_time()
    reads = run(piece)
    return reads, time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--no-rescan", action="store_true", help="time the gateway's screen only")
    args = parser.parse_args()
    rows = []
    for name, piece in PATTERNS.items():
        reads, screen_s = timed(with_screen, piece)
        rescan_s = None if args.no_rescan else timed(with_rescan, piece)[1]
        watch_s = timed(with_watch, piece)[1]
        rows.append({"pattern": name, "bytes_per_read": len(piece), "reads": reads, "screen_s": round(screen_s, 4),
                     "rescan_s": None if rescan_s is None else round(rescan_s, 3), "watch_s": round(watch_s, 4)})
    lines = [f"{'pattern':24} {'reads':>7} {'screen':>10} {'rescan':>10} {'watch 256 KiB':>14}"]
    lines += [f"{row['pattern']:24} {row['reads']:7d} {row['screen_s']:9.4f}s "
              f"{'-' if row['rescan_s'] is None else format(row['rescan_s'], '9.3f') + 's':>10} "
              f"{row['watch_s']:13.4f}s" for row in rows]
    print("\n".join(lines))
    if args.json is not None:
        write_json({"python": platform.python_version(), "rows": rows}, args.json)


if __name__ == "__main__":
    main()
