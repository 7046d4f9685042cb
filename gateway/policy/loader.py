"""Read a policy directory into an immutable, validated `PolicySet`.

Every problem is reported with its file and field; nothing here prints key material.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from gateway.policy.model import GatewayConfig, Scope, TenantPolicy

M = TypeVar("M", bound=BaseModel)
GATEWAY_FILE = "gateway.yaml"
TENANTS_DIR = "tenants"


class PolicyLoadError(Exception):
    """The directory is not a valid policy set; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class KeyGrant:
    sha256: str
    tenant: str
    scopes: frozenset[Scope]


@dataclass(frozen=True)
class PolicySet:
    gateway: GatewayConfig
    tenants: dict[str, TenantPolicy]
    keys: dict[str, KeyGrant]
    version: str
    # Upstream credentials resolved once at load (`api_key_env`), per pool; None when loaded without an
    # environment (tools that read policies but never forward).
    pool_credentials: Mapping[str, str | None] | None = field(default=None, repr=False)

    def target_pool(self, tenant: TenantPolicy) -> str:
        return tenant.rollout.pool or self.gateway.default_pool

    def pool_auth(self, pool_name: str) -> dict[str, str]:
        """The Authorization header this pool's upstreams expect, if the pool names a key."""
        if self.pool_credentials is None:
            raise RuntimeError("this policy set was loaded without an environment; it cannot forward")
        key = self.pool_credentials.get(pool_name)
        return {} if key is None else {"authorization": f"Bearer {key}"}


def policy_files(directory: Path) -> list[Path]:
    tenant_files = sorted((directory / TENANTS_DIR).glob("*.yaml")) + sorted(
        (directory / TENANTS_DIR).glob("*.yml")
    )
    return [directory / GATEWAY_FILE, *tenant_files]


def directory_version(directory: Path) -> str:
    """Content hash of every policy file, so any edit (or ConfigMap swap) changes it."""
    digest = hashlib.sha256()
    for path in policy_files(directory):
        digest.update(path.relative_to(directory).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"<missing>")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def load_policy_set(directory: Path, environ: Mapping[str, str] | None = None) -> PolicySet:
    """Load and validate a policy directory. With `environ` (the server's environment), every pool's
    `api_key_env` is resolved now, and a pool whose key is not set makes the whole set invalid."""
    if not directory.is_dir():
        raise PolicyLoadError([f"{directory}: not a directory"])
    problems: list[str] = []
    gateway = _parse(directory / GATEWAY_FILE, GatewayConfig, problems)
    tenants = _load_tenants(directory, problems)
    credentials = None
    if gateway is not None:
        problems.extend(_cross_check(gateway, tenants))
        if environ is not None:
            credentials = _resolve_credentials(directory, gateway, environ, problems)
    keys = _key_index(tenants, problems)
    if problems or gateway is None:
        raise PolicyLoadError(problems)
    return PolicySet(gateway=gateway, tenants=tenants, keys=keys, version=directory_version(directory),
                     pool_credentials=credentials)


def missing_credentials(gateway: GatewayConfig, environ: Mapping[str, str]) -> list[str]:
    """Pools whose `api_key_env` names a variable that is unset or empty in `environ`."""
    return [name for name, pool in gateway.pools.items() if pool.api_key_env and not environ.get(pool.api_key_env)]


def _resolve_credentials(
    directory: Path, gateway: GatewayConfig, environ: Mapping[str, str], problems: list[str]
) -> dict[str, str | None]:
    for name in missing_credentials(gateway, environ):
        variable = gateway.pools[name].api_key_env
        problems.append(f"{directory / GATEWAY_FILE}: pools.{name}.api_key_env: ${variable} is not set or empty")
    return {name: environ.get(pool.api_key_env) if pool.api_key_env else None
            for name, pool in gateway.pools.items()}


def _load_tenants(directory: Path, problems: list[str]) -> dict[str, TenantPolicy]:
    tenants: dict[str, TenantPolicy] = {}
    for path in policy_files(directory)[1:]:
        tenant = _parse(path, TenantPolicy, problems)
        if tenant is None:
            continue
        if tenant.tenant != path.stem:
            problems.append(f"{path}: tenant: {tenant.tenant!r} must match the file name {path.stem!r}")
        elif tenant.tenant in tenants:
            problems.append(f"{path}: tenant: {tenant.tenant!r} is defined twice")
        else:
            tenants[tenant.tenant] = tenant
    return tenants


def _parse(path: Path, model: type[M], problems: list[str]) -> M | None:
    raw = _read_yaml(path, problems)
    if raw is None:
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        problems.extend(_describe(path, error))
        return None


def _read_yaml(path: Path, problems: list[str]) -> dict[str, Any] | None:
    if not path.is_file():
        problems.append(f"{path}: file is missing")
        return None
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "?"
        problems.append(f"{path}: {where}: not valid YAML")
        return None
    if not isinstance(raw, dict):
        problems.append(f"{path}: (top level): must be a mapping")
        return None
    return raw


def _describe(path: Path, error: ValidationError) -> list[str]:
    lines = []
    for item in error.errors(include_input=False, include_url=False):
        field = ".".join(str(part) for part in item["loc"]) or "(top level)"
        lines.append(f"{path}: {field}: {item['msg']}")
    return lines


def _cross_check(gateway: GatewayConfig, tenants: dict[str, TenantPolicy]) -> list[str]:
    problems = []
    for name, tenant in tenants.items():
        for where, pool in tenant.referenced_pools():
            if pool not in gateway.pools:
                problems.append(f"tenants/{name}.yaml: {where}: pool {pool!r} is not defined in gateway.yaml")
    return problems


def _key_index(tenants: dict[str, TenantPolicy], problems: list[str]) -> dict[str, KeyGrant]:
    keys: dict[str, KeyGrant] = {}
    for name, tenant in tenants.items():
        for position, entry in enumerate(tenant.keys):
            if entry.sha256 in keys:
                problems.append(f"tenants/{name}.yaml: keys.{position}.sha256: the same key is used twice")
            keys[entry.sha256] = KeyGrant(sha256=entry.sha256, tenant=name, scopes=frozenset(entry.scopes))
    return keys
