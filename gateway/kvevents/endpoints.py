"""Which KV-event sources the policy set names, and the addresses kvgate connects to. Pure.

vLLM binds its PUB socket (`tcp://*:PORT`) and its replay ROUTER, so kvgate connects to the host and port
given. The replay endpoint is the event port + 1 unless the policy names one. Sources are named
`<pool>/<index>` in reports and metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.policy.model import GatewayConfig, KvEventSource, PoolConfig

WILDCARD_HOSTS = frozenset({"*", "0.0.0.0", "[::]"})
LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class SourceSpec:
    name: str
    endpoint: str
    replay: str | None  # None when it cannot be derived (no numeric port) and the policy names none
    format: str = "vllm"  # the payload decoder (gateway/kvevents/formats/)


def plan_sources(gateway: GatewayConfig) -> list[SourceSpec]:
    specs = []
    for pool_name, pool in gateway.pools.items():
        for index, entry in enumerate(pool.kv_events):
            specs.append(_spec(f"{pool_name}/{index}", entry, pool))
    return specs


def _spec(name: str, entry: str | KvEventSource, pool: PoolConfig) -> SourceSpec:
    endpoint = entry if isinstance(entry, str) else entry.endpoint
    replay = None if isinstance(entry, str) else entry.replay
    named = None if isinstance(entry, str) else entry.format
    connect = connect_address(endpoint)
    event_format = named or ("lmcache" if pool.lmcache else "vllm")
    return SourceSpec(name, connect, connect_address(replay) if replay else next_port(connect), event_format)


def connect_address(endpoint: str) -> str:
    """A bind-style address pasted from vLLM's flags (`tcp://*:5557`) is read as this host."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if sep and colon and host in WILDCARD_HOSTS:
        return f"{scheme}://{LOOPBACK}:{port}"
    return endpoint


MAX_PORT = 65535


class NoNextPortError(ValueError):
    """The event port is the last TCP port, so the replay endpoint cannot be port + 1."""


def next_port(endpoint: str) -> str | None:
    """The replay endpoint by convention (event port + 1); None when the endpoint has no numeric TCP port. The
    policy model refuses a top-port endpoint without `replay`, so a loaded policy never reaches the error."""
    head, colon, port = endpoint.rpartition(":")
    if not endpoint.startswith("tcp://") or not colon or not port.isdigit():
        return None
    if int(port) >= MAX_PORT:
        raise NoNextPortError(f"{endpoint}: port {int(port)} has no next port for the replay endpoint; "
                              "name the replay endpoint explicitly")
    return f"{head}:{int(port) + 1}"
