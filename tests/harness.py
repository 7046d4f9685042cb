"""Build policy directories with fresh keys, and run a real gateway process in front of upstreams."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from gateway.keys import hash_key, new_key
from tests.procs import ServerProcess, free_port, kvgate_command, run_server
from tests.salt_vectors import GATEWAY_SECRET, known_salt


class PolicyDir:
    """A policy directory under test: pools, tenants and the plain keys the tests use."""

    def __init__(self, root: Path, pools: dict[str, dict[str, Any]], **gateway: Any) -> None:
        self.root = root
        self.gateway: dict[str, Any] = {"pools": pools, "default_pool": next(iter(pools)), **gateway}
        self.tenants: dict[str, dict[str, Any]] = {}
        self.keys: dict[str, str] = {}

    def add_tenant(self, name: str, scopes: tuple[str, ...] = ("inference",), **sections: Any) -> str:
        """Add a tenant with one key of `scopes`; returns the key."""
        self.tenants[name] = {"tenant": name, "keys": [], **sections}
        key = self.add_key(name, scopes)
        self.keys[name] = key
        return key

    def add_key(self, tenant: str, scopes: tuple[str, ...]) -> str:
        key = new_key()
        self.tenants[tenant]["keys"].append({"sha256": hash_key(key), "scopes": list(scopes)})
        return key

    def write(self) -> Path:
        (self.root / "tenants").mkdir(parents=True, exist_ok=True)
        (self.root / "gateway.yaml").write_text(yaml.safe_dump(self.gateway, sort_keys=False))
        for name, tenant in self.tenants.items():
            self.write_tenant(name, tenant)
        return self.root

    def write_tenant(self, name: str, tenant: dict[str, Any]) -> None:
        (self.root / "tenants" / f"{name}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))


def new_secret() -> str:
    """The salt secret of a served gateway: fixed, so expected salts can be literal known-answer vectors."""
    return GATEWAY_SECRET


def expected_salt(secret: str, tenant: str, epoch: int = 1, user: str | None = None) -> str:
    """The salt the product must derive, from tests/salt_vectors.py (never from gateway.salts)."""
    return known_salt(secret, tenant, epoch, user)


@contextmanager
def run_gateway(
    policy_dir: Path, log_path: Path, secret: str, env: dict[str, str] | None = None
) -> Iterator[ServerProcess]:
    port = free_port()
    argv = kvgate_command("serve", "--policies", str(policy_dir), "--port", str(port))
    gateway_env = {"KVGATE_SALT_SECRET": secret, "KVGATE_RELOAD_INTERVAL_S": "0.2",
                   "KVGATE_STATE_PATH": str(log_path.parent / f"state-{port}.sqlite3"), **(env or {})}
    with run_server(argv, port, log_path, env=gateway_env, ready_path="/livez") as server:
        yield server


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
