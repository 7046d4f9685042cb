"""Path ambiguity rules and the rollout draw."""

from __future__ import annotations

import pytest

from gateway.errors import BadRequest
from gateway.http.auth import check_path
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy
from gateway.proxy.rollout import choose_pool, draw_percent


@pytest.mark.parametrize(
    "raw",
    [b"/v1%2Fcompletions", b"/v1%2fmodels", b"/v1/../metrics", b"/v1/./models", b"//v1/models",
     b"/v1//models", b"/v1/%2E%2E/metrics", b"/v1\\models", b"/v1/models/..", b"/v1/%5cmodels",
     b"/v1/models%00"],
)
def test_ambiguous_paths_are_refused(raw: bytes) -> None:
    with pytest.raises(BadRequest):
        check_path(raw)


@pytest.mark.parametrize("raw", [b"/v1/models", b"/v1/chat/completions", b"/v1/models/", b"/V1/Models"])
def test_plain_paths_pass_the_ambiguity_check(raw: bytes) -> None:
    check_path(raw)


def _policies(percent: float) -> tuple[PolicySet, TenantPolicy]:
    gateway = GatewayConfig.model_validate(
        {"pools": {"offload": {"upstreams": ["http://a"]}, "control": {"upstreams": ["http://b"]}},
         "default_pool": "offload"})
    tenant = TenantPolicy.model_validate(
        {"tenant": "t", "rollout": {"pool": "offload", "percent": percent, "else_pool": "control"}})
    return PolicySet(gateway=gateway, tenants={"t": tenant}, keys={}, version="v"), tenant


def test_draw_is_deterministic_and_in_range() -> None:
    draws = [draw_percent(f"user-{index}") for index in range(1000)]
    assert draws == [draw_percent(f"user-{index}") for index in range(1000)]
    assert all(0 <= draw < 100 for draw in draws)


def test_raising_percent_only_moves_users_to_the_target() -> None:
    users = [f"u{index}" for index in range(2000)]
    previous = {user: "control" for user in users}
    for percent in (0, 10, 25, 50, 75, 100):
        policies, tenant = _policies(percent)
        current = {user: choose_pool(policies, tenant, user, "rid") for user in users}
        moved_back = [user for user in users if previous[user] == "offload" and current[user] == "control"]
        assert moved_back == []
        previous = current
    assert set(previous.values()) == {"offload"}
