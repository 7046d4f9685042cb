"""The server's composition: every long-lived part is built here at start-up and closed here at shutdown.

The request features (gateway.proxy.features) are listed once, in order, in `request_features`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from gateway.ledger.feature import UserSaltFeature
from gateway.ledger.service import LedgerService
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.outcomes import ShadowOutcome
from gateway.policy.loader import load_policy_set
from gateway.policy.reloader import PolicyHolder
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Features, RequestFeature
from gateway.proxy.forward import Proxy
from gateway.proxy.otel_metrics import OtelFeature, OtelGenAIMetrics
from gateway.proxy.upstream import new_session
from gateway.settings import Settings
from gateway.shadow.client import ShadowClient
from gateway.shadow.feature import ShadowFeature
from gateway.shadow.recorder import ShadowRecorder
from gateway.shadow.runner import ShadowRunner
from gateway.shadow.store import ShadowStore, open_shadow_store
from gateway.storage import Storage
from gateway.tasks import TaskSupervisor

log = get_logger(__name__)


@dataclass
class State:
    """Everything built at start-up and shared by requests."""

    holder: PolicyHolder
    metrics: GatewayMetrics
    session: aiohttp.ClientSession
    proxy: Proxy
    features: Features
    tasks: TaskSupervisor
    shadow: ShadowRunner
    ledger: LedgerService
    storage: Storage
    ready: bool = True


async def start(settings: Settings, secret: bytes, metrics: GatewayMetrics, genai: OtelGenAIMetrics | None) -> State:
    policies = load_policy_set(Path(settings.policies), os.environ)
    holder = PolicyHolder(Path(settings.policies), policies, metrics, os.environ)
    metrics.prime(policies.tenants, ShadowOutcome)
    holder.listeners.append(lambda current: metrics.prime(current.tenants, ShadowOutcome))
    session = new_session(settings.upstream_connections, settings.connect_timeout_s, settings.read_timeout_s)
    tasks = TaskSupervisor("gateway")
    tasks.spawn(holder.watch(settings.reload_interval_s), "policy-watch")
    storage = await Storage.open(settings.redis_url, settings.state_path)
    ledger = await LedgerService.open(settings, metrics, holder, tasks)
    health = UpstreamHealth()
    shadow = _shadow_runner(settings, metrics, health, tasks, await open_shadow_store(storage))
    features = Features(request_features(ledger, shadow, genai))
    log.info("gateway_started", policy_version=policies.version, tenants=sorted(policies.tenants),
             features=[feature.name for feature in features.all])
    proxy = Proxy(session, secret, health, features)
    return State(holder, metrics, session, proxy, features, tasks, shadow, ledger, storage)


def request_features(
    ledger: LedgerService, shadow: ShadowRunner, genai: OtelGenAIMetrics | None
) -> list[RequestFeature]:
    """Every feature that hooks into a request, in the order they run."""
    features: list[RequestFeature] = [UserSaltFeature(ledger.remember_user_salt), ShadowFeature(shadow)]
    if genai is not None:
        features.append(OtelFeature(genai))
    return features


def _shadow_runner(
    settings: Settings, metrics: GatewayMetrics, health: UpstreamHealth, tasks: TaskSupervisor, store: ShadowStore
) -> ShadowRunner:
    recorder = ShadowRecorder(store, settings.shadow_flush_interval_s)
    tasks.spawn(recorder.run(), "shadow-recorder")
    return ShadowRunner(ShadowClient(settings.connect_timeout_s), metrics, recorder, TaskSupervisor("shadow"),
                        health, settings.shadow_timeout_s)


async def stop(state: State) -> None:
    state.ready = False
    await state.ledger.close()
    await state.tasks.close()
    await state.shadow.close()
    await state.session.close()
    await state.storage.close()
    log.info("gateway_stopped")
