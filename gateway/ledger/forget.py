"""`kvgate tenant forget T`: raise the tenant's `cache.salt_epoch` in its policy file, so no block cached
under an earlier salt can be hit again. The file is edited in place at the one value that changes, so
comments and layout survive; the running gateway hot-reloads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.policy.loader import TENANTS_DIR
from gateway.policy.model import TenantPolicy


class ForgetError(Exception):
    pass


@dataclass(frozen=True)
class EpochChange:
    tenant: str
    path: Path
    old_epoch: int
    new_epoch: int


def forget_tenant(directory: Path, tenant: str) -> EpochChange:
    path = _tenant_file(directory, tenant)
    text = path.read_text()
    policy = TenantPolicy.model_validate(yaml.safe_load(text))
    if policy.cache.isolation == "none":
        raise ForgetError(
            f"{tenant!r} has cache.isolation: none, so its requests carry no cache_salt and its salt epoch "
            "changes nothing: its cached blocks could still be hit. Set cache.isolation to tenant or user first "
            "(that alone makes its earlier unsalted blocks unreachable to it).")
    old = policy.cache.salt_epoch
    updated = with_salt_epoch(text, old + 1)
    if TenantPolicy.model_validate(yaml.safe_load(updated)).cache.salt_epoch != old + 1:
        raise ForgetError(f"{path}: could not raise cache.salt_epoch")  # pragma: no cover - defensive
    _replace_file(path, updated)
    return EpochChange(tenant, path, old, old + 1)


def _tenant_file(directory: Path, tenant: str) -> Path:
    for suffix in (".yaml", ".yml"):
        path = directory / TENANTS_DIR / f"{tenant}{suffix}"
        if path.is_file():
            return path
    raise ForgetError(f"no policy file for tenant {tenant!r} under {directory / TENANTS_DIR}")


def _replace_file(path: Path, text: str) -> None:
    """Write beside, then rename: the reloader never sees a half-written file (the temp name is not *.yaml)."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def with_salt_epoch(text: str, epoch: int) -> str:
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if not isinstance(root, yaml.MappingNode):
        raise ForgetError("a tenant policy must be a mapping")
    cache = _value(root, "cache")
    if cache is None:
        return text + ("" if text.endswith("\n") else "\n") + f"cache:\n  salt_epoch: {epoch}\n"
    if isinstance(cache, yaml.ScalarNode):  # `cache:` with nothing under it
        return _splice(text, cache, f"\n  salt_epoch: {epoch}")
    if not isinstance(cache, yaml.MappingNode):
        raise ForgetError("cache must be a mapping")
    current = _value(cache, "salt_epoch")
    if current is not None:
        return _splice(text, current, str(epoch))
    if cache.flow_style:
        return _splice(text, cache, _flow_with_epoch(cache, epoch))
    return _insert_first_key(text, cache, f"salt_epoch: {epoch}")


def _value(mapping: yaml.MappingNode, key: str) -> yaml.Node | None:
    for key_node, value_node in mapping.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return value_node  # type: ignore[no-any-return]
    return None


def _splice(text: str, node: yaml.Node, replacement: str) -> str:
    return text[: node.start_mark.index] + replacement + text[node.end_mark.index :]


def _insert_first_key(text: str, mapping: yaml.MappingNode, line: str) -> str:
    mark: yaml.Mark = mapping.value[0][0].start_mark
    line_start: int = mark.index - mark.column
    return text[:line_start] + " " * mark.column + line + "\n" + text[line_start:]


def _flow_with_epoch(mapping: yaml.MappingNode, epoch: int) -> str:
    values = yaml.safe_load(yaml.serialize(mapping)) or {}
    values["salt_epoch"] = epoch
    flow: str = yaml.safe_dump(values, default_flow_style=True)
    return flow.strip()
