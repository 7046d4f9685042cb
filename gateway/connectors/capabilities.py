"""Which policy fields each pool's connector can enforce; `kvgate policy check` prints the rest. Pure.

Facts (docs/lmcache.md has the sources): vLLM 0.25's OffloadingConnector reads `max_offload_tokens` but not
`max_load_tokens`. LMCache 0.5.6 reads only `lmcache.*` keys, so neither cap reaches it: a store cap of 0 is
sent as `lmcache.skip_save`, which its in-process adapter honours and its multi-process path does not read;
nothing limits what LMCache loads. In multi-process mode the server's key holds `cache_salt` but not the
`lmcache.*` configs, so there the tenant tag travels but isolates nothing — the salt does. No connector
enforces `retention_seconds` or `allowed_media`: the ledger audits them after the fact, and LMCache's
in-process events name every tier `cpu`.
"""

from __future__ import annotations

from collections.abc import Iterator

from gateway.policy.loader import PolicySet
from gateway.policy.model import PoolConfig, TenantPolicy

UPSTREAM_MEDIA = {"offloading": ("GPU", "CPU"), "lmcache": ("GPU", "CPU", "DISK", "REMOTE"),
                  "lmcache-mp": ("GPU", "CPU", "DISK", "REMOTE"), "none": ("GPU",)}


def connector_warnings(policies: PolicySet) -> list[str]:
    """One line per (tenant, pool, field) the pool's connector cannot enforce."""
    lines: list[str] = []
    for name, tenant in sorted(policies.tenants.items()):
        for pool_name in _pools_of(policies, tenant):
            pool = policies.gateway.pools[pool_name]
            lines += [f"tenants/{name}.yaml: {field}: {why} (pool {pool_name!r}, connector {pool.connector})"
                      for field, why in _unenforced(tenant, pool)]
    return lines


def _pools_of(policies: PolicySet, tenant: TenantPolicy) -> list[str]:
    named = {policies.target_pool(tenant), tenant.rollout.else_pool, tenant.shadow.pool}
    return sorted(pool for pool in named if pool is not None)


def _unenforced(tenant: TenantPolicy, pool: PoolConfig) -> Iterator[tuple[str, str]]:
    offload = tenant.offload
    if pool.lmcache:
        yield from _lmcache_gaps(tenant, pool)
    elif pool.connector == "offloading" and offload.max_load_tokens is not None:
        yield "offload.max_load_tokens", "vLLM 0.25's OffloadingConnector ignores it (0.32+ reads it)"
    risky = [m for m in UPSTREAM_MEDIA[pool.connector] if m not in offload.allowed_media]
    if risky and pool.connector != "none":
        note = "; LMCache's in-process events call every tier cpu" if pool.connector == "lmcache" else ""
        yield "offload.allowed_media", f"the connector may still place blocks on {risky}; audited, not prevented{note}"


def _lmcache_gaps(tenant: TenantPolicy, pool: PoolConfig) -> Iterator[tuple[str, str]]:
    offload = tenant.offload
    if offload.max_load_tokens is not None:
        yield "offload.max_load_tokens", "LMCache has no per-request load cap"
    if offload.max_offload_tokens not in (None, 0):
        yield "offload.max_offload_tokens", "LMCache stores all or nothing; only 0 is honoured (as skip_save)"
    if offload.max_offload_tokens == 0 and pool.connector == "lmcache-mp":
        yield "offload.max_offload_tokens", "sent as lmcache.skip_save, which LMCache 0.5.6's MP path ignores"
    if pool.connector == "lmcache-mp" and tenant.cache.isolation != "none":
        yield "cache.isolation", "the MP server keys on cache_salt, not on the tenant tag: run the canary"
    if tenant.cache.isolation == "none":
        yield "cache.isolation", "no salt, so no tenant tag: LMCache entries are shared across tenants"
