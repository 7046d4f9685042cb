"""The server's composition: every long-lived part is built here at start-up and closed here at shutdown.

The request features (gateway.proxy.features) are listed once, in order, in `request_features`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gateway.canary.runner import CanaryRunner
from gateway.epochs.floor import open_floor_store
from gateway.epochs.guard import EpochFloorGuard
from gateway.http.workers import IngesterClient, SiblingSalts, WorkerRole
from gateway.ledger.feature import UserSaltFeature
from gateway.ledger.service import LedgerService, LedgerWiring
from gateway.limits.rate import open_rate_limiter
from gateway.limits.slots import RequestLimits
from gateway.log import get_logger
from gateway.metrics import GatewayMetrics
from gateway.outcomes import ShadowOutcome
from gateway.policy.loader import PolicyLoadError, PolicySet, load_policy_set
from gateway.policy.reloader import PolicyHolder
from gateway.proxy.balance import UpstreamHealth
from gateway.proxy.features import Features, RequestFeature
from gateway.proxy.forward import Proxy, ProxyOptions
from gateway.proxy.misspath import MissPath
from gateway.proxy.otel_metrics import OtelFeature, OtelGenAIMetrics
from gateway.proxy.shape import JsonLimits
from gateway.proxy.smallcalls import SmallCalls
from gateway.proxy.upstream import UpstreamClient
from gateway.reuse.feature import AdmissionFeature
from gateway.reuse.shared import Admission
from gateway.reuse.store import open_trace_store
from gateway.reuse.trace import ReuseTrace, TraceMetrics, TraceSettings
from gateway.reuse.trace_feature import ReuseTraceFeature
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
    calls: SmallCalls  # the gateway's own small upstream calls (canary, version probes, plan's metrics)
    proxy: Proxy
    features: Features
    tasks: TaskSupervisor
    shadow: ShadowRunner
    ledger: LedgerService
    storage: Storage
    canary: CanaryRunner
    limits: RequestLimits
    reuse: ReuseTrace | None = None
    floors: EpochFloorGuard | None = None
    ready: bool = True
    role: WorkerRole | None = None  # set under `serve --workers N`
    ingester: IngesterClient | None = None  # workers other than the ingesting one forward some admin routes
    sibling_salts: SiblingSalts | None = None  # user-salt digests passed between workers


async def start(settings: Settings, secret: bytes, metrics: GatewayMetrics, genai: OtelGenAIMetrics | None,
                role: WorkerRole | None = None) -> State:
    """Build every part. Under `--workers N` (a `role`), only the ingesting worker subscribes to KV events and
    runs the ledger's and the canary's periodic work; request-path parts run in every worker and meet in the
    shared store, as replicas do."""
    ingests = role is None or role.ingests
    policies = load_policy_set(Path(settings.policies), os.environ)
    storage = await Storage.open(settings.redis_url, settings.state_path)
    floors = EpochFloorGuard(await open_floor_store(storage))
    try:
        await floors.start(policies)  # a set below a tenant's salt-epoch floor never comes into force
    except PolicyLoadError:
        await storage.close()
        raise
    holder = PolicyHolder(Path(settings.policies), policies, metrics, os.environ)
    holder.gate = floors
    holder.listeners.append(floors.on_installed)
    metrics.prime(policies.tenants, ShadowOutcome)
    holder.listeners.append(lambda current: metrics.prime(current.tenants, ShadowOutcome))
    metrics.prime_admission(returning_tenants(policies))
    holder.listeners.append(lambda current: metrics.prime_admission(returning_tenants(current)))
    calls = SmallCalls.pooled(settings.upstream_connections, settings.connect_timeout_s, settings.read_timeout_s)
    tasks = TaskSupervisor("gateway")
    tasks.spawn(holder.watch(settings.reload_interval_s), "policy-watch")
    ledger, sibling_salts = await _ledger(settings, metrics, holder, tasks, role, storage)
    health = UpstreamHealth()
    shadow = _shadow_runner(settings, metrics, health, tasks, await open_shadow_store(storage))
    admission = Admission.on(storage, secret, settings.admission_sketch_width)
    reuse = await _reuse_trace(settings, secret, metrics, holder, tasks, storage)
    features = Features(request_features(ledger, ShadowFeature(shadow, secret), genai,
                                         AdmissionFeature(admission, metrics), reuse))
    log.info("gateway_started", policy_version=policies.version, tenants=sorted(policies.tenants),
             features=[feature.name for feature in features.all])
    relay = UpstreamClient(settings.upstream_connections, settings.connect_timeout_s, settings.read_timeout_s)
    options = ProxyOptions(JsonLimits(settings.json_max_depth, settings.json_max_items), settings.body_timeout_s,
                           metrics.client_stalls, metrics.events_unread)
    proxy = Proxy(relay, secret, health, features, MissPath(calls, secret, metrics, ledger.remember_user_salt),
                  options)
    canary = _canary(calls, secret, metrics, holder, tasks, scheduled=ingests)
    limits = RequestLimits(settings.max_in_flight, open_rate_limiter(storage, metrics.rate_limit_fallbacks.inc),
                           metrics)
    if role is not None:
        metrics.workers_configured.set(role.count)
    if role is not None and role.replaced:
        metrics.worker_restarts.inc()
    ingester = None if ingests or role is None else IngesterClient(role.ingester_socket)
    return State(holder, metrics, calls, proxy, features, tasks, shadow, ledger, storage, canary, limits, reuse,
                 floors, role=role, ingester=ingester, sibling_salts=sibling_salts)


async def _ledger(settings: Settings, metrics: GatewayMetrics, holder: PolicyHolder, tasks: TaskSupervisor,
                  role: WorkerRole | None, storage: Storage) -> tuple[LedgerService, SiblingSalts | None]:
    if role is None:
        return await LedgerService.open(settings, metrics, holder, tasks, wiring=LedgerWiring(storage)), None
    ledger = await LedgerService.open(settings, metrics, holder, tasks, wiring=LedgerWiring(storage, role.ingests))
    return ledger, SiblingSalts(role, ledger, metrics.salt_announcements_failed.inc)


def _canary(calls: SmallCalls, secret: bytes, metrics: GatewayMetrics, holder: PolicyHolder,
            tasks: TaskSupervisor, scheduled: bool = True) -> CanaryRunner:
    """The isolation canary: its counters primed per pool, its schedule owned by the gateway's supervisor (in
    one worker only under `--workers`, so upstreams see one canary schedule per host)."""
    canary = CanaryRunner(calls, secret, metrics.registry)
    canary.prime(holder.current)
    holder.listeners.append(canary.prime)
    if scheduled:
        tasks.spawn(canary.schedule(lambda: holder.current), "isolation-canary")
    return canary


def request_features(
    ledger: LedgerService, shadow: ShadowFeature, genai: OtelGenAIMetrics | None,
    admission: AdmissionFeature | None = None, reuse: ReuseTrace | None = None,
) -> list[RequestFeature]:
    """Every feature that hooks into a request, in the order they run."""
    features: list[RequestFeature] = [UserSaltFeature(ledger.remember_user_salt), shadow]
    if admission is not None:
        features.append(admission)
    if genai is not None:
        features.append(OtelFeature(genai))
    if reuse is not None:
        features.append(ReuseTraceFeature(reuse))
    return features


def returning_tenants(policies: PolicySet) -> list[str]:
    return [name for name, tenant in policies.tenants.items() if tenant.offload.admission.mode == "returning"]


async def _reuse_trace(settings: Settings, secret: bytes, metrics: GatewayMetrics, holder: PolicyHolder,
                       tasks: TaskSupervisor, storage: Storage) -> ReuseTrace | None:
    """The reuse trace behind `kvgate plan` (gateway/reuse/), unless KVGATE_REUSE_TRACE=false."""
    if not settings.reuse_trace:
        return None
    store = await open_trace_store(storage, settings.reuse_max_records)
    trace_settings = TraceSettings(block_tokens=settings.reuse_block_tokens, sample_rate=settings.reuse_sample_rate,
                                   max_roots=settings.reuse_max_roots)
    trace = ReuseTrace(store, secret, trace_settings, TraceMetrics(metrics.registry), lambda: holder.current)
    holder.listeners.append(trace.on_policies)
    tasks.spawn(trace.run(), "reuse-trace")
    return trace


def _shadow_runner(
    settings: Settings, metrics: GatewayMetrics, health: UpstreamHealth, tasks: TaskSupervisor, store: ShadowStore
) -> ShadowRunner:
    recorder = ShadowRecorder(store, settings.shadow_flush_interval_s)
    tasks.spawn(recorder.run(), "shadow-recorder")
    # The relay's client, in an instance of its own: shadows fill their own connection slots, never the relay's.
    # Nothing read for the whole shadow timeout is the same failure as the timeout itself.
    upstream = UpstreamClient(settings.upstream_connections, settings.connect_timeout_s, settings.shadow_timeout_s)
    return ShadowRunner(ShadowClient(upstream), metrics, recorder, TaskSupervisor("shadow"), health,
                        settings.shadow_timeout_s)


async def stop(state: State) -> None:
    state.ready = False
    await state.ledger.close()
    if state.sibling_salts is not None:
        state.sibling_salts.close()
    await state.tasks.close()
    if state.reuse is not None:
        await state.reuse.close()
    await state.shadow.close()
    await state.calls.close()
    if state.ingester is not None:
        await state.ingester.close()
    state.proxy.client.close()
    await state.storage.close()
    log.info("gateway_stopped")
