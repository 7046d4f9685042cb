"""LMCache's blocks in the ledger: `kvgate sim --lmcache` publishes vLLM's GPU events and LMCache-shaped chunk
events (lower-case medium, token-only chunk hashes, no removals) on one real ZMQ stream; a LedgerService on a
pool marked `connector: lmcache` decodes them with the lmcache format.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.connectors.lmcache_tags import lmcache_params
from gateway.policy.model import OffloadPolicy
from tests.harness import PolicyDir, expected_salt
from tests.ledger.support import SECRET, Backend, counts, eventually, running_ledger
from tests.procs import ServerProcess, free_port, free_port_pair, kvgate_command, run_server

TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"offload": {"allowed_media": ["GPU", "CPU", "DISK"]}},
    "globex": {"offload": {"allowed_media": ["GPU", "CPU"]}},  # a disk tier is a violation for globex
}
PROMPT = "one shared document for both tenants ".ljust(512, "x")  # 32 GPU blocks, 2 LMCache chunks


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    port, events = free_port(), free_port_pair()
    argv = kvgate_command("sim", "--port", str(port), "--lmcache", "--lmcache-medium", "LocalDiskBackend",
                          "--kv-events-endpoint", f"tcp://*:{events}",
                          "--kv-events-replay-endpoint", f"tcp://*:{events + 1}")
    with run_server(argv, port, tmp_path / "sim.log", ready_path="/health") as server:
        yield server, events


def _complete(sim: ServerProcess, tenant: str) -> None:
    """The body the gateway forwards to an LMCache pool: the tenant's salt and its tag."""
    salt = expected_salt(SECRET, tenant, 1)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 1, "cache_salt": salt,
            "kv_transfer_params": lmcache_params(SECRET.encode(), salt, OffloadPolicy(), {})}
    httpx.post(f"{sim.url}/v1/completions", json=body, timeout=30).raise_for_status()


def _policies(root: Path, events: int) -> Path:
    pools = {"lm": {"upstreams": ["http://127.0.0.1:9"], "connector": "lmcache",
                    "kv_events": [f"tcp://127.0.0.1:{events}"]}}
    policy = PolicyDir(root, pools)
    for name, sections in TENANTS.items():
        policy.add_tenant(name, **sections)
    return policy.write()


def test_lmcache_chunks_are_attributed_per_tenant_and_a_disk_tier_is_a_medium_violation(
    tmp_path: Path, sim: tuple[ServerProcess, int]
) -> None:
    server, events = sim
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")
    root = _policies(tmp_path / "policies", events)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            for tenant in TENANTS:
                await asyncio.to_thread(_complete, server, tenant)
            report = await eventually(ledger.audit, _settled)
            assert counts(report, "acme", "DISK") == (2, 0, 2) and counts(report, "globex", "DISK") == (2, 0, 2)
            assert report["tenants"]["acme"]["DISK"]["violations"]["medium"] == 0
            assert report["tenants"]["globex"]["DISK"]["violations"]["medium"] == 2
            assert "unattributed" not in report["tenants"]
            assert report["unobserved"]["lm"] and "evictions" in report["unobserved"]["lm"][0]
            assert ledger.sample("kvgate_kv_blocks_resident", tenant="globex", medium="DISK") == 2

    asyncio.run(scenario())
    table = subprocess.run([sys.executable, "-m", "gateway.cli.audit", "audit", "--policies", str(root)],
                           capture_output=True, text=True, timeout=60, check=False,
                           env={**os.environ, "KVGATE_STATE_PATH": str(backend.state_path)})
    assert table.returncode == 0, table.stderr
    assert "pool lm: unobserved: evictions from in-process LMCache tiers" in table.stdout  # the offline report too


def _settled(report: dict[str, Any]) -> bool:
    return all(counts(report, tenant, "DISK")[0] == 2 and counts(report, tenant, "GPU")[0] == 32
               for tenant in TENANTS)
