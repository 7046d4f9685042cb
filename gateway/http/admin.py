"""Admin views (admin scope). Nothing here shows key material or salts."""

from __future__ import annotations

from typing import Any

from gateway.policy.loader import PolicySet
from gateway.policy.model import KvEventSource, PoolConfig, TenantPolicy


def policies_view(policies: PolicySet) -> dict[str, Any]:
    return {
        "policy_version": policies.version,
        "default_pool": policies.gateway.default_pool,
        "pools": {name: _pool_view(pool) for name, pool in policies.gateway.pools.items()},
        "tenants": {name: _tenant_view(policies, tenant) for name, tenant in policies.tenants.items()},
    }


def _pool_view(pool: PoolConfig) -> dict[str, Any]:
    events = [source if isinstance(source, str) else _source_text(source) for source in pool.kv_events]
    return {"upstreams": pool.upstreams, "api_key_env": pool.api_key_env, "kv_events": events}


def _source_text(source: KvEventSource) -> str:
    return source.endpoint if source.replay is None else f"{source.endpoint} (replay {source.replay})"


def _tenant_view(policies: PolicySet, tenant: TenantPolicy) -> dict[str, Any]:
    view = tenant.model_dump(exclude={"keys"})
    view["keys"] = [{"scopes": entry.scopes} for entry in tenant.keys]
    view["target_pool"] = policies.target_pool(tenant)
    return view
