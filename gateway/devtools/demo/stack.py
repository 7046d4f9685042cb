"""Start the demo's processes: two simulated vLLM servers and the gateway, on free loopback ports."""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, run_server
from gateway.keys import hash_key, new_key

EXAMPLE_POLICIES = Path(__file__).resolve().parents[3] / "policies"
GPU_BLOCKS = "640"  # 10,240 tokens: a few long prefixes per tenant overflow it, so eviction happens
CPU_TIER_BYTES = str(64 * 147456 * 1000)  # room for 64,000 tokens of the simulated 8B model
UPSTREAM_KEY_ENV = {"offload": "VLLM_OFFLOAD_KEY", "control": "VLLM_CONTROL_KEY"}


@dataclass
class DemoStack:
    gateway: ServerProcess
    sims: dict[str, ServerProcess]
    keys: dict[str, str]
    admin_key: str
    workdir: Path


def _sim_argv(port: int, events_port: int, upstream_key: str, offload: bool) -> list[str]:
    argv = kvgate_command("sim", "--port", str(port), f"--api-key={upstream_key}", "--gpu-blocks", GPU_BLOCKS,
                          "--kv-events-endpoint", f"tcp://*:{events_port}",
                          "--kv-events-replay-endpoint", f"tcp://*:{events_port + 1}")
    return [*argv, "--offload", "--cpu-bytes-to-use", CPU_TIER_BYTES] if offload else argv


def write_policies(target: Path, sims: dict[str, tuple[int, int]]) -> tuple[dict[str, str], str]:
    """Copy the example policies, pointing pools at the simulators and giving each tenant a fresh key."""
    shutil.copytree(EXAMPLE_POLICIES, target)
    gateway = yaml.safe_load((target / "gateway.yaml").read_text())
    for pool, (port, events) in sims.items():
        gateway["pools"][pool].update(upstreams=[f"http://127.0.0.1:{port}"], kv_events=[f"tcp://127.0.0.1:{events}"])
    (target / "gateway.yaml").write_text(yaml.safe_dump(gateway, sort_keys=False))
    keys = {path.stem: _rekey(path) for path in sorted((target / "tenants").glob("*.yaml"))}
    _mirror_everything(target / "tenants" / "initech.yaml")
    admin_key = new_key()
    _add_key(target / "tenants" / "acme.yaml", admin_key, ["admin", "metrics"])
    return keys, admin_key


def _mirror_everything(path: Path) -> None:
    """The demo is short: mirror every eligible request so the paired comparison has enough pairs."""
    tenant: dict[str, Any] = yaml.safe_load(path.read_text())
    tenant["shadow"]["sample"] = 1.0
    path.write_text(yaml.safe_dump(tenant, sort_keys=False))


def _rekey(path: Path) -> str:
    key = new_key()
    tenant: dict[str, Any] = yaml.safe_load(path.read_text())
    tenant["keys"] = [{"sha256": hash_key(key), "scopes": ["inference"]}]
    path.write_text(yaml.safe_dump(tenant, sort_keys=False))
    return key


def _add_key(path: Path, key: str, scopes: list[str]) -> None:
    tenant: dict[str, Any] = yaml.safe_load(path.read_text())
    tenant["keys"].append({"sha256": hash_key(key), "scopes": scopes})
    path.write_text(yaml.safe_dump(tenant, sort_keys=False))


@contextmanager
def demo_stack(workdir: Path) -> Iterator[DemoStack]:
    upstream_keys = {pool: secrets.token_urlsafe(16) for pool in UPSTREAM_KEY_ENV}
    ports = {pool: (free_port(), free_port_pair()) for pool in UPSTREAM_KEY_ENV}
    with ExitStack() as stack:
        sims = {
            pool: stack.enter_context(run_server(
                _sim_argv(port, events, upstream_keys[pool], offload=pool == "offload"), port,
                workdir / f"sim-{pool}.log", ready_path="/health"))
            for pool, (port, events) in ports.items()
        }
        keys, admin_key = write_policies(workdir / "policies", ports)
        gateway = stack.enter_context(_gateway(workdir, upstream_keys))
        yield DemoStack(gateway, sims, keys, admin_key, workdir)


def _gateway(workdir: Path, upstream_keys: dict[str, str]) -> Any:
    port = free_port()
    env = {UPSTREAM_KEY_ENV[pool]: key for pool, key in upstream_keys.items()}
    env |= {"KVGATE_SALT_SECRET": secrets.token_hex(32), "KVGATE_STATE_PATH": str(workdir / "ledger.sqlite3"),
            "KVGATE_LOG_FORMAT": "json"}
    argv = kvgate_command("serve", "--policies", str(workdir / "policies"), "--port", str(port))
    return run_server(argv, port, workdir / "gateway.log", env=env, ready_path="/livez")
