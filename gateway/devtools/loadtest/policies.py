"""A policy directory for a scenario: two pools (the arms), each tenant split 50/50 between them per end user.

Every tenant gets a fresh inference key; the first also carries the admin + metrics key the runner reads
`/metrics`, `/admin/audit` and `/admin/shadow` with. For each tenant and arm the runner picks an end user whom
the sticky rollout sends to that arm, so one tenant (one salt, one ledger account) is measured on both arms.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gateway.devtools.loadtest.model import Scenario
from gateway.devtools.loadtest.targets import Access, TenantAccess
from gateway.keys import hash_key, new_key
from gateway.proxy.rollout import draw_percent

USER_CANDIDATES = 10_000


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, mapping by mapping."""
    out = dict(base)
    for key, value in override.items():
        current = out.get(key)
        out[key] = merged(current, value) if isinstance(current, dict) and isinstance(value, dict) else value
    return out


def tenant_policy(scenario: Scenario, name: str, override: Mapping[str, Any]) -> dict[str, Any]:
    base: dict[str, Any] = {
        "tenant": name,
        "keys": [],
        "cache": {"isolation": "tenant", "salt_epoch": 1, "client_salt": "reject"},
        "offload": {"max_load_tokens": None, "max_offload_tokens": None, "retention_seconds": 3600,
                    "allowed_media": ["GPU", "CPU"]},
        "rollout": {"pool": scenario.pool("offload"), "percent": 50, "else_pool": scenario.pool("control"),
                    "sticky": "user"},
        "shadow": {"sample": 0.0},  # a mirror would warm the control arm's cache and spoil the protocol
        "measure_ttft": False,
    }
    return merged(base, override)


def arm_users(scenario: Scenario, policy: Mapping[str, Any]) -> dict[str, str]:
    """One end user per arm whom this tenant's rollout sends to the arm's pool (gateway.proxy.rollout's draw)."""
    rollout = policy["rollout"]
    tenant = str(policy["tenant"])
    found: dict[str, str] = {}
    for index in range(USER_CANDIDATES):
        user = f"{tenant}-user{index}"
        hit = draw_percent(f"user:{tenant}:{user}") < float(rollout["percent"])
        pool = rollout["pool"] if hit else rollout.get("else_pool")
        arm = scenario.arm_of_pool(str(pool))
        if arm is not None:
            found.setdefault(arm, user)
        if len(found) == len(scenario.arms):
            return found
    raise ValueError(f"tenant {tenant}: its rollout never sends a user to {sorted(set(scenario.arms) - set(found))}")


def write_policy_dir(
    root: Path, scenario: Scenario, upstreams: Mapping[str, str], kv_events: Mapping[str, list[str]],
    api_key_env: Mapping[str, str] | None = None,
) -> Access:
    """Write `root`/gateway.yaml and `root`/tenants/*.yaml; returns the plain keys and users."""
    pools: dict[str, Any] = {}
    for arm, url in upstreams.items():
        pool: dict[str, Any] = {"upstreams": [url], "kv_events": list(kv_events.get(arm, []))}
        if api_key_env and arm in api_key_env:
            pool["api_key_env"] = api_key_env[arm]
        pools[scenario.pool(arm)] = pool
    gateway = {"pools": pools, "default_pool": scenario.pool("offload"), "public_paths": ["/livez"],
               "max_body_bytes": 10 * 1024 * 1024}
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    admin_key = new_key()
    tenants: dict[str, TenantAccess] = {}
    for position, spec in enumerate(scenario.tenants):
        key = new_key()
        policy = tenant_policy(scenario, spec.name, spec.policy)
        policy["keys"] = [{"sha256": hash_key(key), "scopes": ["inference"]}]
        if position == 0:
            policy["keys"].append({"sha256": hash_key(admin_key), "scopes": ["admin", "metrics"]})
        (root / "tenants" / f"{spec.name}.yaml").write_text(yaml.safe_dump(policy, sort_keys=False))
        tenants[spec.name] = TenantAccess(key, arm_users(scenario, policy))
    return Access(admin_key, tenants)
