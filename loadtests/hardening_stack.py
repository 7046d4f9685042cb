"""Shared set-up of the hardening benchmarks: an upstream (the fast benchmark upstream or `kvgate sim`), a
gateway in front of it with tenants and limits, and /proc readings of the gateway (RSS, open descriptors).
Every process is started on loopback and stopped by PID."""

from __future__ import annotations

import json
import os
import resource
import secrets
import sys
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.devtools.localproc import ServerProcess, free_port, kvgate_command, run_server
from gateway.keys import hash_key, new_key
from loadtests import procstat

REPO_ROOT = Path(__file__).resolve().parent.parent
MODEL = "sim-model"
PROMPT = "Summarise the cache policy of this gateway in one short sentence, please."


@dataclass(frozen=True)
class Stack:
    upstream: ServerProcess
    gateway: ServerProcess
    keys: dict[str, str]

    def completion_url(self) -> str:
        return f"{self.gateway.url}/v1/completions"

    def headers(self, tenant: str) -> dict[str, str]:
        return {"content-type": "application/json", "authorization": f"Bearer {self.keys[tenant]}"}


def stream_body(max_tokens: int = 16, prompt: str = PROMPT) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": True}).encode()


def raise_open_files() -> int:
    """Raise this process's soft descriptor limit to the hard one (thousands of sockets); returns it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def write_policies(root: Path, upstream_url: str, tenants: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """One pool; each tenant gets a fresh inference key and the given sections; plus an `ops` metrics key."""
    keys: dict[str, str] = {}
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    gateway = {"pools": {"bench": {"upstreams": [upstream_url]}}, "default_pool": "bench",
               "public_paths": ["/livez"]}
    (root / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    for name, sections in {**tenants, "ops": {}}.items():
        keys[name] = new_key()
        scopes = ["metrics", "admin"] if name == "ops" else ["inference"]
        tenant = {"tenant": name, "keys": [{"sha256": hash_key(keys[name]), "scopes": scopes}], **sections}
        (root / "tenants" / f"{name}.yaml").write_text(yaml.safe_dump(tenant, sort_keys=False))
    return keys


def importable_here() -> dict[str, str]:
    paths = [str(REPO_ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def fast_upstream(work: Path, ttft_ms: float, token_ms: float, tokens: int) -> AbstractContextManager[ServerProcess]:
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(port), "--ttft-ms", str(ttft_ms),
            "--token-ms", str(token_ms), "--tokens", str(tokens)]
    return run_server(argv, port, work / "upstream.log", env=importable_here(), ready_path="/health")


def simulator(work: Path, *flags: str) -> AbstractContextManager[ServerProcess]:
    port = free_port()
    argv = kvgate_command("sim", "--port", str(port), *flags)
    return run_server(argv, port, work / "sim.log", ready_path="/health")


@contextmanager
def gateway_stack(
    work: Path, upstream_cm: AbstractContextManager[ServerProcess], tenants: Mapping[str, Mapping[str, Any]],
    env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    work.mkdir(parents=True, exist_ok=True)
    with upstream_cm as upstream:
        keys = write_policies(work / "policies", upstream.url, tenants)
        port = free_port()
        gateway_env = {"KVGATE_SALT_SECRET": "bench-" + secrets.token_hex(16), "KVGATE_LOG_LEVEL": "warning",
                       "KVGATE_STATE_PATH": str(work / "state.sqlite3"), **(env or {})}
        argv = kvgate_command("serve", "--policies", str(work / "policies"), "--port", str(port))
        with run_server(argv, port, work / "gateway.log", env=gateway_env) as gateway:
            yield Stack(upstream, gateway, keys)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    return procstat.rss_bytes(pid) / 2**20


def metric_values(text: str, name: str) -> dict[str, float]:
    """Samples of one metric from a Prometheus text page, keyed by their label text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name):
            labels, _, value = line[len(name):].rpartition(" ")
            values[labels] = float(value)
    return values
