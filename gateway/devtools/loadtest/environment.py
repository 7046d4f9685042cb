"""What the run happened on: versions, the upstreams' cache sizes, the gateway's policy version, the host."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import Any

import gateway
from gateway.devtools.loadtest.model import ARMS, Scenario
from gateway.devtools.loadtest.observe import Observer
from gateway.devtools.loadtest.targets import Targets

REPO = Path(__file__).resolve().parents[3]


def source_revision() -> str | None:
    """The checkout's commit (plus `+dirty`), or what a staged snapshot recorded in REVISION."""
    stamp = REPO / "REVISION"
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


async def describe(observer: Observer, scenario: Scenario, targets: Targets) -> dict[str, Any]:
    versions: dict[str, Any] = {}
    kv_tokens: dict[str, int | None] = {}
    for arm in ARMS:
        version = await observer.upstream_json(arm, "/version")
        versions[arm] = version.get("version") if isinstance(version, dict) else None
        kv_tokens[arm] = await observer.kv_cache_tokens(arm)
    policies = await observer.admin("/admin/policies")
    return {
        "mode": targets.mode,
        "gateway_url": targets.gateway_url,
        "upstream_urls": {arm: upstream.url for arm, upstream in targets.upstreams.items()},
        "upstream_versions": versions,
        "kv_cache_tokens": kv_tokens,
        "pools": {arm: scenario.pool(arm) for arm in ARMS},
        "users": {tenant: access.users for tenant, access in targets.access.tenants.items()},
        "policy_version": (policies or {}).get("version") or (policies or {}).get("policy_version"),
        "kvgate_version": gateway.__version__,
        "source_revision": source_revision(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "restart_hooks": {arm: type(u.restart_hook).__name__ if u.restart_hook else None
                          for arm, u in targets.upstreams.items()},
    }
