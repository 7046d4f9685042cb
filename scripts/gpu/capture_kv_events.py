"""Record a vLLM KV-event stream verbatim: one JSON line per ZMQ message (receive time, sequence number, every
frame in hex, and the msgpack payload decoded), until SIGTERM or --seconds. Used on the GPU host beside a run
(CAPTURE_EVENTS=1 in scripts/gpu/host.sh) so a real stream can become a test fixture."""

from __future__ import annotations

import argparse
import json
import signal
import time
from pathlib import Path
from typing import Any

import msgspec
import zmq


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes_hex": value.hex()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    socket = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.setsockopt(zmq.RCVTIMEO, 200)
    socket.connect(args.endpoint)
    deadline = time.monotonic() + args.seconds
    with args.out.open("w") as out:
        while not stop["now"] and time.monotonic() < deadline:
            try:
                frames = socket.recv_multipart()
            except zmq.Again:
                continue
            payload = frames[-1]
            try:
                decoded = _plain(msgspec.msgpack.decode(payload))
            except msgspec.DecodeError as error:
                decoded = {"undecodable": str(error)}
            seq = int.from_bytes(frames[1], "big") if len(frames) == 3 else None
            out.write(json.dumps({"t": time.time(), "nparts": len(frames), "seq": seq,
                                  "frames_hex": [frame.hex() for frame in frames], "decoded": decoded}) + "\n")
            out.flush()
    socket.close(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
