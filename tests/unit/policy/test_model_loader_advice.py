"""The policy model's validators, the loader's edge cases on real directories (missing files, odd YAML, `.yml`,
credentials resolved at load), `kvgate policy check`'s advice, and the per-connector warnings, each with the exact
line an operator reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from gateway.connectors.capabilities import connector_warnings
from gateway.policy.advice import policy_warnings
from gateway.policy.loader import PolicyLoadError, PolicySet, directory_version, load_policy_set
from gateway.policy.model import (
    AdmissionPolicy,
    CachePolicy,
    CanaryPolicy,
    GatewayConfig,
    KeyEntry,
    OffloadPolicy,
    PoolConfig,
    RolloutPolicy,
    ShadowPolicy,
    TenantLimits,
    TenantPolicy,
)

HASH = "a" * 64


def first_error(model: type[Any], data: dict[str, Any]) -> tuple[tuple[str | int, ...], str]:
    with pytest.raises(ValidationError) as raised:
        model.model_validate(data)
    error = raised.value.errors()[0]
    return tuple(error["loc"]), str(error["msg"])


# --- the model ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("urls", "kept"), [
    (["http://a:8000/"], ["http://a:8000"]),
    (["https://a/v1//"], ["https://a/v1"]),
    (["http://a", "http://b/"], ["http://a", "http://b"]),
])
def test_upstream_urls_lose_their_trailing_slashes(urls: list[str], kept: list[str]) -> None:
    assert PoolConfig(upstreams=urls).upstreams == kept


@pytest.mark.parametrize(("data", "field", "message"), [
    ({"upstreams": []}, "upstreams", "at least 1 item"),
    ({"upstreams": ["ftp://a"]}, "upstreams", "upstream 'ftp://a' must start with http:// or https://"),
    ({"upstreams": ["a:8000"]}, "upstreams", "must start with http://"),
    ({"upstreams": ["http://a"], "api_key_env": "KVGATE_SALT_SECRET"}, "api_key_env", "is a gateway setting"),
    ({"upstreams": ["http://a"], "api_key_env": "kvgate_salt_secret"}, "api_key_env", "is a gateway setting"),
    ({"upstreams": ["http://a"], "api_key_env": "1KEY"}, "api_key_env", "must be an environment variable name"),
    ({"upstreams": ["http://a"], "api_key_env": "MY-KEY"}, "api_key_env", "must be an environment variable name"),
    ({"upstreams": ["http://a"], "connector": "nixl"}, "connector", "Input should be"),
    ({"upstreams": ["http://a"], "recompute": "never"}, "recompute", "Input should be"),
    ({"upstreams": ["http://a"], "kv_events": [{"endpoint": "tcp://h:1", "format": "json"}]}, "kv_events",
     "Input should be"),
    ({"upstreams": ["http://a"], "surprise": 1}, "surprise", "Extra inputs are not permitted"),
])
def test_pool_problems_name_the_field(data: dict[str, Any], field: str, message: str) -> None:
    loc, msg = first_error(PoolConfig, data)
    assert loc[0] == field and message in msg


@pytest.mark.parametrize(("connector", "lmcache"), [("offloading", False), ("none", False), ("lmcache", True),
                                                    ("lmcache-mp", True)])
def test_which_connectors_are_lmcache(connector: str, lmcache: bool) -> None:
    assert PoolConfig(upstreams=["http://a"], connector=connector).lmcache is lmcache  # type: ignore[arg-type]


@pytest.mark.parametrize(("data", "message"), [
    ({"pools": {}, "default_pool": "p"}, "at least 1 item"),
    ({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "q"}, "default_pool 'q' is not one of the pools"),
    ({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p", "public_paths": ["/v1/models"]},
     "'/v1/models' cannot be public"),
    ({"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p", "max_body_bytes": 0}, "greater than 0"),
])
def test_gateway_problems(data: dict[str, Any], message: str) -> None:
    assert message in first_error(GatewayConfig, data)[1]


@pytest.mark.parametrize(("model", "data", "message"), [
    (KeyEntry, {"sha256": "A" * 64, "scopes": ["inference"]}, "64 lowercase hex characters"),
    (KeyEntry, {"sha256": "a" * 63, "scopes": ["inference"]}, "64 lowercase hex characters"),
    (KeyEntry, {"sha256": HASH, "scopes": []}, "at least 1 item"),
    (KeyEntry, {"sha256": HASH, "scopes": ["root"]}, "Input should be"),
    (CachePolicy, {"salt_epoch": -1}, "greater than or equal to 0"),
    (CachePolicy, {"salt_epoch": 20261201}, "less than or equal to 1000000"),  # a date is a mistake
    (CachePolicy, {"isolation": "team"}, "Input should be"),
    (RolloutPolicy, {"percent": 50}, "else_pool is required when percent is below 100"),
    (RolloutPolicy, {"percent": 100.5, "else_pool": "b"}, "less than or equal to 100"),
    (ShadowPolicy, {"sample": 0.1}, "pool is required when sample is above 0"),
    (ShadowPolicy, {"pool": "p", "sample": 1.5}, "less than or equal to 1"),
    (TenantLimits, {"max_in_flight": 1.0}, "valid integer"),  # strict: 1.0 is not an integer here
    (TenantLimits, {"requests_per_minute": True}, "valid integer"),
    (TenantLimits, {"requests_per_minute": 0}, "greater than or equal to 1"),
    (AdmissionPolicy, {"mode": "sometimes"}, "Input should be"),
    (AdmissionPolicy, {"min_seen": 255}, "less than or equal to 254"),
    (TenantPolicy, {"tenant": "unattributed"}, "'unattributed' is reserved"),
    (TenantPolicy, {"tenant": "Acme"}, "must be lowercase letters"),
    (TenantPolicy, {"tenant": "-acme"}, "must be lowercase letters"),
    (TenantPolicy, {"tenant": "a" * 64}, "must be lowercase letters"),
    (TenantPolicy, {"tenant": "ünï"}, "must be lowercase letters"),
])
def test_tenant_field_problems(model: type[Any], data: dict[str, Any], message: str) -> None:
    assert message in first_error(model, data)[1]


NUMERIC_FIELDS = [
    (GatewayConfig, {"pools": {"p": {"upstreams": ["http://a"]}}, "default_pool": "p"}, ("max_body_bytes",), 1024),
    (CachePolicy, {}, ("salt_epoch",), 2),
    (OffloadPolicy, {}, ("max_load_tokens",), 0),
    (OffloadPolicy, {}, ("max_offload_tokens",), 512),
    (OffloadPolicy, {}, ("retention_seconds",), 600),
    (AdmissionPolicy, {}, ("window_s",), 60),
    (AdmissionPolicy, {}, ("min_seen",), 2),
    (AdmissionPolicy, {}, ("prefix_chunks",), 3),
    (RolloutPolicy, {"else_pool": "b"}, ("percent",), 50),
    (ShadowPolicy, {"pool": "p"}, ("sample",), 1),
    (ShadowPolicy, {}, ("max_in_flight",), 2),
    (CanaryPolicy, {}, ("interval_s",), 60),
    (CanaryPolicy, {}, ("prefix_tokens",), 512),
    (CanaryPolicy, {}, ("settle_s",), 1),
]


@pytest.mark.parametrize(("model", "base", "loc", "number"), NUMERIC_FIELDS)
@pytest.mark.parametrize("shape", ["yes", "quoted"])
def test_a_number_written_as_a_boolean_or_a_string_is_refused(model: type[Any], base: dict[str, Any],
                                                              loc: tuple[str], number: int, shape: str) -> None:
    """Wrong version: lax coercion reads `salt_epoch: yes` as epoch 1 and `max_offload_tokens: "512"` as 512."""
    assert getattr(model.model_validate({**base, loc[0]: number}), loc[0]) == number  # a YAML number is fine
    value: object = True if shape == "yes" else str(number)
    assert first_error(model, {**base, loc[0]: value})[0] == loc


@pytest.mark.parametrize("name", ["a", "0", "a" * 63, "acme-corp_2"])
def test_valid_tenant_names(name: str) -> None:
    assert TenantPolicy(tenant=name).tenant == name


@pytest.mark.parametrize(("value", "mode"), [("returning", "returning"), ("all", "all"),
                                             ({"mode": "returning", "min_seen": 3}, "returning")])
def test_admission_takes_a_mode_string_or_an_object(value: Any, mode: str) -> None:
    policy = TenantPolicy.model_validate({"tenant": "t", "offload": {"admission": value}})
    assert policy.offload.admission.mode == mode


def test_the_pools_a_tenant_names_are_listed_with_their_field() -> None:
    tenant = TenantPolicy.model_validate({"tenant": "t", "rollout": {"pool": "a", "percent": 10, "else_pool": "b"},
                                          "shadow": {"pool": "c", "sample": 0.5}})
    assert tenant.referenced_pools() == [("rollout.pool", "a"), ("rollout.else_pool", "b"), ("shadow.pool", "c")]
    assert TenantPolicy(tenant="t").referenced_pools() == []


# --- the loader on real directories -------------------------------------------------------------------------------


def write_dir(root: Path, gateway: object, tenants: dict[str, object], suffix: str = ".yaml") -> Path:
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    if gateway is not None:
        (root / "gateway.yaml").write_text(gateway if isinstance(gateway, str) else yaml.safe_dump(gateway))
    for name, body in tenants.items():
        text = body if isinstance(body, str) else yaml.safe_dump(body)
        (root / "tenants" / f"{name}{suffix}").write_text(text)
    return root


GATEWAY: dict[str, Any] = {"pools": {"p": {"upstreams": ["http://a"], "api_key_env": "POOL_KEY"},
                                     "q": {"upstreams": ["http://b"]}}, "default_pool": "p"}


def problems_of(directory: Path, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(PolicyLoadError) as raised:
        load_policy_set(directory, environ)
    assert str(raised.value) == "\n".join(raised.value.problems)
    return raised.value.problems


def test_a_path_that_is_not_a_directory(tmp_path: Path) -> None:
    assert problems_of(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}: not a directory"]


def test_a_missing_gateway_file_is_named(tmp_path: Path) -> None:
    root = write_dir(tmp_path, None, {"acme": {"tenant": "acme"}})
    assert problems_of(root) == [f"{root / 'gateway.yaml'}: file is missing"]


@pytest.mark.parametrize(("text", "problem"), [
    ("- a\n- b\n", "(top level): must be a mapping"),
    ("", "(top level): must be a mapping"),  # an empty file is null
    ("just text", "(top level): must be a mapping"),
    ("pools: {p: [\n", "line 2: not valid YAML"),
])
def test_a_gateway_file_that_is_not_a_mapping(tmp_path: Path, text: str, problem: str) -> None:
    root = write_dir(tmp_path, text, {})
    assert problems_of(root) == [f"{root / 'gateway.yaml'}: {problem}"]


def test_every_problem_of_every_file_is_reported_at_once(tmp_path: Path) -> None:
    root = write_dir(tmp_path, GATEWAY, {"acme": {"tenant": "acme", "cache": {"salt_epoch": -1}},
                                         "beta": {"tenant": "beta", "shadow": {"pool": "zz", "sample": 1}}})
    assert problems_of(root) == [
        f"{root / 'tenants' / 'acme.yaml'}: cache.salt_epoch: Input should be greater than or equal to 0",
        "tenants/beta.yaml: shadow.pool: pool 'zz' is not defined in gateway.yaml",
    ]


def test_yml_files_are_tenants_too_and_a_name_defined_twice_is_refused(tmp_path: Path) -> None:
    root = write_dir(tmp_path, GATEWAY, {"acme": {"tenant": "acme"}})
    write_dir(root, None, {"beta": {"tenant": "beta"}}, suffix=".yml")
    assert set(load_policy_set(root).tenants) == {"acme", "beta"}
    write_dir(root, None, {"acme": {"tenant": "acme"}}, suffix=".yml")
    assert problems_of(root) == [f"{root / 'tenants' / 'acme.yml'}: tenant: 'acme' is defined twice"]


def test_credentials_are_resolved_at_load_and_a_missing_one_refuses_the_set(tmp_path: Path) -> None:
    root = write_dir(tmp_path, GATEWAY, {})
    assert problems_of(root, {}) == [f"{root / 'gateway.yaml'}: pools.p.api_key_env: $POOL_KEY is not set or empty"]
    assert problems_of(root, {"POOL_KEY": ""}) != []
    loaded = load_policy_set(root, {"POOL_KEY": "upstream-secret", "OTHER": "x"})
    assert loaded.pool_auth("p") == {"authorization": "Bearer upstream-secret"}
    assert loaded.pool_auth("q") == {}  # a pool without api_key_env sends no key


def test_a_set_loaded_without_an_environment_cannot_forward(tmp_path: Path) -> None:
    loaded = load_policy_set(write_dir(tmp_path, GATEWAY, {}))
    with pytest.raises(RuntimeError, match="loaded without an environment"):
        loaded.pool_auth("p")


def test_a_tenant_goes_to_its_rollout_pool_or_the_default(tmp_path: Path) -> None:
    loaded = load_policy_set(write_dir(tmp_path, GATEWAY, {"acme": {"tenant": "acme"},
                                                           "beta": {"tenant": "beta", "rollout": {"pool": "q"}}}))
    assert [loaded.target_pool(loaded.tenants[name]) for name in ("acme", "beta")] == ["p", "q"]


def test_the_version_changes_with_any_file_and_not_otherwise(tmp_path: Path) -> None:
    root = write_dir(tmp_path, GATEWAY, {"acme": {"tenant": "acme"}})
    first = directory_version(root)
    assert len(first) == 16 and first == directory_version(root)
    (root / "tenants" / "notes.txt").write_text("not a policy file")
    assert directory_version(root) == first
    write_dir(root, None, {"beta": {"tenant": "beta"}})
    second = directory_version(root)
    assert second != first
    (root / "tenants" / "beta.yaml").rename(root / "tenants" / "beta.yml")  # same bytes, another name
    assert directory_version(root) not in (first, second)


# --- advice and connector warnings ---------------------------------------------------------------------------------


def policy_set(tenants: dict[str, dict[str, Any]], pools: dict[str, dict[str, Any]] | None = None) -> PolicySet:
    pools = pools or {"p": {"upstreams": ["http://a"]}}
    gateway = GatewayConfig.model_validate({"pools": pools, "default_pool": next(iter(pools))})
    return PolicySet(gateway=gateway, tenants={name: TenantPolicy.model_validate({"tenant": name, **body})
                                               for name, body in tenants.items()}, keys={}, version="v")


@pytest.mark.parametrize(("offload", "fields"), [
    ({}, []),  # nothing named: nothing to warn about
    ({"retention_seconds": 60}, ["retention_seconds"]),
    ({"allowed_media": ["GPU"]}, ["allowed_media"]),
    ({"allowed_media": ["GPU", "CPU"], "retention_seconds": 5}, ["retention_seconds", "allowed_media"]),
    ({"max_offload_tokens": 0}, []),
])
def test_rules_that_cannot_be_audited_without_a_salt_are_named(offload: dict[str, Any], fields: list[str]) -> None:
    warnings = policy_warnings(policy_set({"acme": {"cache": {"isolation": "none"}, "offload": offload}}))
    assert warnings == [f"tenants/acme.yaml: offload.{field}: cannot be audited with cache.isolation: none (its "
                        "blocks carry no salt and are reported as unattributed)" for field in fields]


@pytest.mark.parametrize("isolation", ["tenant", "user"])
def test_salted_tenants_get_no_advice(isolation: str) -> None:
    tenants = {"acme": {"cache": {"isolation": isolation}, "offload": {"retention_seconds": 60}}}
    assert policy_warnings(policy_set(tenants)) == []


def warnings_for(connector: str, tenant: dict[str, Any]) -> list[str]:
    return connector_warnings(policy_set({"acme": tenant}, {"p": {"upstreams": ["http://a"],
                                                                  "connector": connector}}))


PREFIX = "tenants/acme.yaml: "


@pytest.mark.parametrize(("connector", "tenant", "lines"), [
    ("offloading", {}, []),
    ("none", {"offload": {"allowed_media": ["GPU"]}}, []),
    ("offloading", {"offload": {"max_load_tokens": 0}},
     ["offload.max_load_tokens: vLLM 0.25's OffloadingConnector ignores it (0.32+ reads it) (pool 'p', connector "
      "offloading)"]),
    ("offloading", {"offload": {"allowed_media": ["GPU"]}},
     ["offload.allowed_media: the connector may still place blocks on ['CPU']; audited, not prevented (pool 'p', "
      "connector offloading)"]),
    ("lmcache", {},
     ["offload.allowed_media: the connector may still place blocks on ['DISK', 'REMOTE']; audited, not prevented; "
      "LMCache's in-process events call every tier cpu (pool 'p', connector lmcache)"]),
    ("lmcache", {"offload": {"max_offload_tokens": 512, "max_load_tokens": 0,
                             "allowed_media": ["GPU", "CPU", "DISK", "REMOTE"]}},
     ["offload.max_load_tokens: LMCache has no per-request load cap (pool 'p', connector lmcache)",
      "offload.max_offload_tokens: LMCache stores all or nothing; only 0 is honoured (as skip_save) (pool 'p', "
      "connector lmcache)"]),
    ("lmcache-mp", {"offload": {"max_offload_tokens": 0, "allowed_media": ["GPU", "CPU", "DISK", "REMOTE"]}},
     ["offload.max_offload_tokens: sent as lmcache.skip_save, which LMCache 0.5.6's MP path ignores (pool 'p', "
      "connector lmcache-mp)",
      "cache.isolation: the MP server keys on cache_salt, not on the tenant tag: run the canary (pool 'p', "
      "connector lmcache-mp)"]),
    ("lmcache", {"cache": {"isolation": "none"}, "offload": {"allowed_media": ["GPU", "CPU", "DISK", "REMOTE"]}},
     ["cache.isolation: no salt, so no tenant tag: LMCache entries are shared across tenants (pool 'p', connector "
      "lmcache)"]),
])
def test_connector_warnings(connector: str, tenant: dict[str, Any], lines: list[str]) -> None:
    assert warnings_for(connector, tenant) == [PREFIX + line for line in lines]


def test_every_pool_a_tenant_can_reach_is_checked_once() -> None:
    pools: dict[str, dict[str, Any]] = {"a": {"upstreams": ["http://a"]},
                                        "b": {"upstreams": ["http://b"], "connector": "none"},
                                        "c": {"upstreams": ["http://c"]}}
    tenant = {"rollout": {"pool": "a", "percent": 50, "else_pool": "c"}, "shadow": {"pool": "a", "sample": 0.5},
              "offload": {"max_load_tokens": 0}}
    lines = connector_warnings(policy_set({"acme": tenant}, pools))
    assert [line.split("(pool ")[1] for line in lines] == ["'a', connector offloading)",
                                                           "'c', connector offloading)"]
