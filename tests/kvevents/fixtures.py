"""The real vLLM 0.25.0 KV-event captures (tests/fixtures), read only."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KV_EVENTS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.25.0" / "kv-events"
SERVERS = ("offload", "control", "cli", "selfdesc")
RUN_OF = {"offload": "offload_run3", "control": "control_run3", "cli": "cli_run3", "selfdesc": "selfdesc_run2"}


@dataclass(frozen=True)
class Captured:
    seq: int
    line: dict[str, Any]

    @property
    def frames(self) -> list[bytes] | None:
        hexes = self.line.get("frames_hex")
        return None if hexes is None else [bytes.fromhex(part) for part in hexes]

    @property
    def decoded(self) -> list[Any]:
        decoded: list[Any] = self.line["decoded"]
        return decoded


def captured(server: str) -> list[Captured]:
    path = KV_EVENTS / f"{server}_kv_events.sample.jsonl"
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    return [Captured(line["seq"], line) for line in lines]


def counts() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((KV_EVENTS / "kv_events_counts.json").read_text())
    return loaded


def replay_exchange(server: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((KV_EVENTS / f"{server}_replay.json").read_text())
    return loaded
