"""Readers of the real vLLM 0.25.0 captures in tests/fixtures, for the simulator's unit tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm-0.25.0"


def kv_event_frames(server: str) -> list[list[bytes]]:
    """The raw ZMQ frames (topic, seq, payload) of every captured message of `server` that kept its bytes."""
    path = FIXTURES / "kv-events" / f"{server}_kv_events.sample.jsonl"
    frames: list[list[bytes]] = []
    for line in path.read_text().splitlines():
        message = json.loads(line)
        if len(message.get("frames_hex", [])) == 3:
            frames.append([bytes.fromhex(part) for part in message["frames_hex"]])
    return frames


def decode_payload(payload: bytes) -> list[Any]:
    value: list[Any] = msgspec.msgpack.decode(payload)
    return value


def replay_exchange(server: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "kv-events" / f"{server}_replay.json").read_text())
    return data


def transfer_steps() -> dict[str, Any]:
    """`kv-transfer-params/steps.json`: what cache_salt and the transfer caps did on the real connector."""
    data: dict[str, Any] = json.loads((FIXTURES / "kv-transfer-params" / "steps.json").read_text())
    return data


def http_capture(name: str) -> str:
    return (FIXTURES / "http" / name).read_text()


def captured_bodies() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "http" / "offload_responses.json").read_text())
    return data


def metrics_text(name: str) -> str:
    return (FIXTURES / "metrics" / name).read_text()
