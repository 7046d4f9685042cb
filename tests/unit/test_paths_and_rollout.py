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


# Known-answer draws: the first 8 bytes of sha256(key), big-endian, scaled to [0, 100). Computed outside the
# product: `printf '%s' user:t:alice | openssl dgst -sha256` → 4c3c424577ebaa47… → 29.7794477…
DRAWS = {"user:t:alice": 29.779447742468673, "user:t:bob": 10.752762606105907, "request:rid-1": 71.92914050444075}


@pytest.mark.parametrize(("key", "draw"), list(DRAWS.items()))
def test_draw_matches_the_known_answer(key: str, draw: float) -> None:
    assert draw_percent(key) == pytest.approx(draw, abs=1e-9)


def _sticky_policies(percent: float, sticky: str = "user") -> tuple[PolicySet, TenantPolicy]:
    gateway = GatewayConfig.model_validate(
        {"pools": {"offload": {"upstreams": ["http://a"]}, "control": {"upstreams": ["http://b"]}},
         "default_pool": "control"})
    tenant = TenantPolicy.model_validate(
        {"tenant": "t", "rollout": {"pool": "offload", "percent": percent, "else_pool": "control", "sticky": sticky}})
    return PolicySet(gateway=gateway, tenants={"t": tenant}, keys={}, version="v"), tenant


@pytest.mark.parametrize(
    ("percent", "user", "pool"),
    [(29.8, "alice", "offload"), (29.7, "alice", "control"), (10.8, "bob", "offload"), (10.7, "bob", "control"),
     (50, "alice", "offload"), (0, "bob", "control")],
)
def test_sticky_users_go_by_their_own_draw(percent: float, user: str, pool: str) -> None:
    policies, tenant = _sticky_policies(percent)
    assert choose_pool(policies, tenant, user, "rid-1") == pool


@pytest.mark.parametrize(("percent", "pool"), [(71.9, "control"), (72.0, "offload")])
def test_without_a_user_the_request_id_draws(percent: float, pool: str) -> None:
    policies, tenant = _sticky_policies(percent)
    assert choose_pool(policies, tenant, None, "rid-1") == pool
    assert choose_pool(*_sticky_policies(percent, sticky="request"), "alice", "rid-1") == pool


def test_a_full_rollout_or_no_else_pool_always_takes_the_target() -> None:
    policies, tenant = _sticky_policies(100)
    assert choose_pool(policies, tenant, "bob", "rid-1") == "offload"
    gateway = policies.gateway
    default = TenantPolicy.model_validate({"tenant": "t"})
    assert choose_pool(PolicySet(gateway, {"t": default}, {}, "v"), default, "alice", "rid-1") == "control"


def test_some_users_stay_back_below_full_rollout() -> None:
    """A choose_pool that always returns the target fails here."""
    policies, tenant = _policies(50)
    pools = [choose_pool(policies, tenant, f"u{index}", "rid") for index in range(200)]
    assert 60 < pools.count("offload") < 140


def test_a_draw_exactly_at_percent_stays_back() -> None:
    """`percent` is exclusive: a user whose draw equals it is not moved (monotone: raising it moves them)."""
    policies, tenant = _sticky_policies(DRAWS["user:t:alice"])
    assert choose_pool(policies, tenant, "alice", "rid-1") == "control"
