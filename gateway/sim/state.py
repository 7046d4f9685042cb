"""Everything one simulator app instance owns (nothing of it is module-global)."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

from gateway.sim.config import SimConfig
from gateway.sim.engine import Engine
from gateway.sim.generation import OutputGenerator
from gateway.sim.kv_events import NullSink
from gateway.sim.metrics import SimMetrics
from gateway.sim.publisher import KvEventPublisher
from gateway.sim.recorder import RequestRecorder


@dataclass
class SimState:
    config: SimConfig
    metrics: SimMetrics
    engine: Engine
    generator: OutputGenerator
    recorder: RequestRecorder
    publisher: KvEventPublisher | None
    fingerprint: str
    started_at: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0
    sleep_level: int = 0
    reset_calls: int = 0

    @classmethod
    def build(cls, config: SimConfig) -> SimState:
        """A fresh state; with `--kv-events-endpoint` it includes the (not yet opened) publisher."""
        metrics = SimMetrics(config)
        publisher = KvEventPublisher(config) if config.events_enabled else None
        return cls(
            config=config,
            metrics=metrics,
            engine=Engine(config, metrics, publisher or NullSink()),
            generator=OutputGenerator(config.seed, config.corrupt_output),
            recorder=RequestRecorder(config.record_limit),
            publisher=publisher,
            fingerprint=fingerprint(config),
        )


def fingerprint(config: SimConfig) -> str:
    """`system_fingerprint` in vLLM's form (`vllm-<version>-<8 hex>`), stable for a model and seed."""
    digest = hashlib.sha256(f"{config.model}:{config.seed}".encode()).hexdigest()[:8]
    return f"vllm-{config.vllm_version}-{digest}"
