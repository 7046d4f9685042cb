"""Building blocks for ledger tests: policy directories, a running LedgerService, polling with a deadline."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from gateway.ledger.config import LedgerSettings
from gateway.ledger.service import LedgerService
from gateway.metrics import GatewayMetrics
from gateway.policy.loader import load_policy_set
from gateway.policy.reloader import PolicyHolder
from gateway.settings import Settings
from gateway.tasks import TaskSupervisor
from tests.harness import PolicyDir
from tests.salt_vectors import LEDGER_SECRET

T = TypeVar("T")
SECRET = LEDGER_SECRET
DEADLINE_S = 20.0


def fast_config(**overrides: Any) -> LedgerSettings:
    """Short timers so tests finish quickly; each test gets its own Redis key prefix."""
    values: dict[str, Any] = {
        "flush_interval_s": 0.05, "replay_timeout_s": 0.5, "probe_interval_s": 0.3, "lost_after_s": 1.0,
        "salt_refresh_s": 0.1, "sweep_interval_s": 0.2, "redis_prefix": f"kvgate-test:{uuid.uuid4().hex}:",
    }
    return LedgerSettings(**(values | overrides))


def write_policies(root: Path, sources: dict[str, list[str]], tenants: dict[str, dict[str, Any]]) -> Path:
    pools = {name: {"upstreams": ["http://127.0.0.1:9"], "kv_events": endpoints}
             for name, endpoints in sources.items()}
    policy = PolicyDir(root, pools)
    for name, sections in tenants.items():
        policy.add_tenant(name, **sections)
    return policy.write()


@dataclass
class Backend:
    """Where a LedgerService keeps its ledger: a SQLite file or a Redis URL."""

    name: str
    state_path: Path
    redis_url: str | None = None
    prefix: str = field(default_factory=lambda: f"kvgate-test:{uuid.uuid4().hex}:")

    def settings(self) -> Settings:
        return Settings(salt_secret=SecretStr(SECRET), state_path=self.state_path, redis_url=self.redis_url)

    def config(self, **overrides: Any) -> LedgerSettings:
        return fast_config(redis_prefix=self.prefix, **overrides)


@dataclass
class Running:
    service: LedgerService
    holder: PolicyHolder
    metrics: GatewayMetrics

    async def audit(self, tenant: str | None = None) -> dict[str, Any]:
        return await self.service.audit(self.holder.current, tenant, None)

    def sample(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def running_ledger(policy_root: Path, backend: Backend, **config: Any) -> AsyncIterator[Running]:
    metrics = GatewayMetrics(CollectorRegistry())
    holder = PolicyHolder(policy_root, load_policy_set(policy_root), metrics)
    tasks = TaskSupervisor("ledger-test")
    service = await LedgerService.open(backend.settings(), metrics, holder, tasks, backend.config(**config))
    try:
        yield Running(service, holder, metrics)
    finally:
        await service.close()
        await tasks.close()


async def eventually(probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], timeout_s: float = DEADLINE_S) -> T:
    """Poll `probe` until `check` holds; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s; last value: {value!r}")
        await asyncio.sleep(0.05)  # polling interval, not synchronisation


def counts(report: dict[str, Any], tenant: str, medium: str) -> tuple[int, int, int]:
    view = report["tenants"].get(tenant, {}).get(medium)
    if view is None:
        return (0, 0, 0)
    return view["stored"], view["removed"], view["resident"]
