"""Which pool serves a request (docs/policies.md, `rollout`): a deterministic, monotone percentage split."""

from __future__ import annotations

import hashlib

from gateway.policy.loader import PolicySet
from gateway.policy.model import TenantPolicy

DRAW_SCALE = 2**64


def draw_percent(key: str) -> float:
    """A uniform draw in [0, 100) that is a pure function of `key`."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") * 100.0 / DRAW_SCALE


def choose_pool(policies: PolicySet, tenant: TenantPolicy, user: str | None, request_id: str) -> str:
    """A user whose draw is below `percent` goes to the target pool, so raising it only moves users in."""
    target = policies.target_pool(tenant)
    rollout = tenant.rollout
    if rollout.percent >= 100 or rollout.else_pool is None:
        return target
    sticky = rollout.sticky == "user" and user is not None
    key = f"user:{tenant.tenant}:{user}" if sticky else f"request:{request_id}"
    return target if draw_percent(key) < rollout.percent else rollout.else_pool
