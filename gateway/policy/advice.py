"""Warnings `kvgate policy check` prints for valid sets that do not do what they seem to. Pure."""

from __future__ import annotations

from gateway.policy.loader import PolicySet


def policy_warnings(policies: PolicySet) -> list[str]:
    """A tenant without a salt (`isolation: none`) has blocks that cannot be attributed to it, so retention and
    media rules written for it can never be judged."""
    warnings = []
    for name, tenant in sorted(policies.tenants.items()):
        if tenant.cache.isolation != "none":
            continue
        offload = tenant.offload
        named = [field for field in ("retention_seconds", "allowed_media") if field in offload.model_fields_set
                 and getattr(offload, field) is not None]
        for field in named:
            warnings.append(f"tenants/{name}.yaml: offload.{field}: cannot be audited with cache.isolation: none "
                            "(its blocks carry no salt and are reported as unattributed)")
    return warnings
