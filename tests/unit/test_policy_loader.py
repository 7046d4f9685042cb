"""The policy loader: a valid directory loads; every problem names its file and field."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gateway.policy.loader import PolicyLoadError, directory_version, load_policy_set
from tests.harness import PolicyDir

REPO_POLICIES = Path(__file__).resolve().parents[2] / "policies"


def test_shipped_example_policies_are_valid() -> None:
    policies = load_policy_set(REPO_POLICIES)
    assert set(policies.tenants) == {"acme", "globex", "initech"}
    assert policies.tenants["globex"].offload.max_offload_tokens == 0
    assert policies.tenants["initech"].rollout.percent == 50
    assert policies.tenants["initech"].shadow.sample > 0
    assert policies.tenants["acme"].rollout.percent == 100


def _problems(directory: Path) -> list[str]:
    with pytest.raises(PolicyLoadError) as raised:
        load_policy_set(directory)
    return raised.value.problems


def _broken_copy(tmp_path: Path, tenant: str, change: dict[str, object]) -> Path:
    target = tmp_path / "policies"
    shutil.copytree(REPO_POLICIES, target)
    path = target / "tenants" / f"{tenant}.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(change)
    path.write_text(yaml.safe_dump(data))
    return target


def test_bad_field_is_reported_with_file_and_field(tmp_path: Path) -> None:
    directory = _broken_copy(tmp_path, "acme", {"cache": {"isolation": "nobody"}})
    (problem,) = _problems(directory)
    assert problem.startswith(str(directory / "tenants" / "acme.yaml"))
    assert "cache.isolation" in problem


def test_unknown_field_is_refused(tmp_path: Path) -> None:
    (problem,) = _problems(_broken_copy(tmp_path, "acme", {"offlaod": {}}))
    assert "offlaod" in problem and "Extra inputs" in problem


def test_undefined_pool_is_refused(tmp_path: Path) -> None:
    (problem,) = _problems(_broken_copy(tmp_path, "acme", {"rollout": {"pool": "gpu-farm"}}))
    assert "rollout.pool" in problem and "gpu-farm" in problem


def test_tenant_must_match_file_name(tmp_path: Path) -> None:
    (problem,) = _problems(_broken_copy(tmp_path, "acme", {"tenant": "acme2"}))
    assert "must match the file name" in problem


def test_reserved_tenant_name_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "p"
    policy = PolicyDir(directory, {"offload": {"upstreams": ["http://127.0.0.1:1"]}})
    policy.add_tenant("unattributed")
    problems = _problems(policy.write())
    assert any("reserved" in problem for problem in problems)


def test_duplicate_key_across_tenants_is_refused(tmp_path: Path) -> None:
    policy = PolicyDir(tmp_path / "p", {"offload": {"upstreams": ["http://127.0.0.1:1"]}})
    policy.add_tenant("a")
    policy.add_tenant("b")
    policy.tenants["b"]["keys"] = policy.tenants["a"]["keys"]
    problems = _problems(policy.write())
    assert any("the same key is used twice" in problem for problem in problems)


def test_broken_yaml_names_the_line(tmp_path: Path) -> None:
    directory = _broken_copy(tmp_path, "acme", {})
    (directory / "tenants" / "acme.yaml").write_text("tenant: acme\nkeys: [\n")
    (problem,) = _problems(directory)
    assert "acme.yaml: line" in problem and "not valid YAML" in problem


def test_problems_never_echo_key_hash_values(tmp_path: Path) -> None:
    secret_looking = "f" * 63
    directory = _broken_copy(tmp_path, "acme", {"keys": [{"sha256": secret_looking, "scopes": ["inference"]}]})
    problems = _problems(directory)
    assert all(secret_looking not in problem for problem in problems)


def test_version_is_a_content_hash(tmp_path: Path) -> None:
    directory = _broken_copy(tmp_path, "acme", {})
    before = directory_version(directory)
    assert directory_version(directory) == before
    (directory / "tenants" / "acme.yaml").write_text((directory / "tenants" / "acme.yaml").read_text() + "\n")
    assert directory_version(directory) != before


def test_public_paths_are_limited_to_local_routes(tmp_path: Path) -> None:
    policy = PolicyDir(tmp_path / "p", {"offload": {"upstreams": ["http://127.0.0.1:1"]}},
                       public_paths=["/v1/models"])
    problems = _problems(policy.write())
    assert any("public_paths" in problem for problem in problems)
