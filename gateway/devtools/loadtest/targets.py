"""What the runner talks to: the gateway and its keys, each arm's upstream, how to find its PID and restart it.

The access file (`keys.json`, written by `--write-policies` or by hand) holds the plain keys, so it is created
readable by its owner only:

    {"admin_key": "...",                       # a key with the admin and metrics scopes
     "tenants": {"acme": {"key": "...", "users": {"offload": "acme-u3", "control": "acme-u0"}}}}

`users` name, per arm, an end user whom the tenant's rollout sends to that arm's pool (sticky per user).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx


@dataclass(frozen=True)
class TenantAccess:
    key: str
    users: dict[str, str]


@dataclass(frozen=True)
class Access:
    admin_key: str
    tenants: dict[str, TenantAccess]

    def to_json(self) -> dict[str, Any]:
        return {"admin_key": self.admin_key,
                "tenants": {name: {"key": t.key, "users": t.users} for name, t in self.tenants.items()}}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Access:
        tenants = {name: TenantAccess(str(entry["key"]), {str(k): str(v) for k, v in entry["users"].items()})
                   for name, entry in data["tenants"].items()}
        return cls(str(data["admin_key"]), tenants)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(self.to_json(), handle, indent=1)

    @classmethod
    def load(cls, path: Path) -> Access:
        return cls.from_json(json.loads(path.read_text()))


class PidSource(Protocol):
    def pid(self) -> int | None: ...


class RestartHook(Protocol):
    def restart(self, timeout_s: float) -> None:
        """Return once the old process is gone and the new one has been started (readiness is polled after)."""


@dataclass(frozen=True)
class FixedPid:
    value: int

    def pid(self) -> int | None:
        return self.value


@dataclass(frozen=True)
class PidFile:
    """A file holding the PID; read at each sample, so a restart hook that rewrites it is followed."""

    path: Path

    def pid(self) -> int | None:
        try:
            return int(self.path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None


@dataclass(frozen=True)
class CommandRestart:
    """A shell command that restarts one upstream (it must stop the old process before it returns)."""

    command: str

    def restart(self, timeout_s: float) -> None:
        completed = subprocess.run(["/bin/sh", "-c", self.command], timeout=timeout_s, check=False,
                                   capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"restart command {shlex.quote(self.command)} exited {completed.returncode}: "
                               f"{completed.stderr.strip()[-500:]}")


@dataclass
class Upstream:
    arm: str
    url: str | None
    pid_source: PidSource | None = None
    restart_hook: RestartHook | None = None
    api_key: str = ""
    """The key vLLM's --api-key expects, for direct (gateway-less) baseline requests."""

    def pid(self) -> int | None:
        return self.pid_source.pid() if self.pid_source is not None else None


@dataclass
class Targets:
    gateway_url: str
    access: Access
    upstreams: dict[str, Upstream]
    mode: str
    notes: list[str] = field(default_factory=list)


def wait_healthy(url: str, timeout_s: float) -> float:
    """Poll `url`/health until it answers 200; returns the seconds waited."""
    started = time.monotonic()
    delay = 0.05
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return time.monotonic() - started
        except httpx.TransportError:
            pass
        if time.monotonic() - started > timeout_s:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:.0f} s")
        time.sleep(delay)  # polling backoff while a server starts, not synchronisation
        delay = min(delay * 2, 1.0)
