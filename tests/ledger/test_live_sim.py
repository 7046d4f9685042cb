"""The ledger fed by `kvgate sim --offload`: real processes, vLLM-exact events, the gateway's rewritten
bodies (salt from policy, the tenant's `max_offload_tokens` cap). A tenant capped at 0 never has a CPU record."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.harness import expected_salt
from tests.ledger.support import SECRET, Backend, Running, counts, eventually, running_ledger, write_policies
from tests.procs import ServerProcess, free_port, free_port_pair, kvgate_command, run_server

TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"offload": {"retention_seconds": 3600, "allowed_media": ["GPU", "CPU"]}},
    "globex": {"offload": {"max_offload_tokens": 0, "allowed_media": ["GPU"]}},
}
PROMPT_CHARS = 512  # one token per byte: 32 GPU blocks, 8 CPU chunks


@pytest.fixture
def sim(tmp_path: Path) -> Iterator[tuple[ServerProcess, int]]:
    port, events = free_port(), free_port_pair()
    argv = kvgate_command("sim", "--port", str(port), "--offload", "--gpu-blocks", "96",
                          "--kv-events-endpoint", f"tcp://*:{events}",
                          "--kv-events-replay-endpoint", f"tcp://*:{events + 1}")
    with run_server(argv, port, tmp_path / "sim.log", ready_path="/health") as server:
        yield server, events


def _complete(sim: ServerProcess, tenant: str, text: str) -> None:
    """The body the gateway forwards for `tenant`: its salt, and its offload cap where the policy sets one."""
    body: dict[str, Any] = {"model": "sim-model", "prompt": text, "max_tokens": 1,
                            "cache_salt": expected_salt(SECRET, tenant, 1)}
    cap = TENANTS[tenant]["offload"].get("max_offload_tokens")
    if cap is not None:
        body["kv_transfer_params"] = {"max_offload_tokens": cap}
    httpx.post(f"{sim.url}/v1/completions", json=body, timeout=30).raise_for_status()


def _prompt(tenant: str, number: int) -> str:
    return f"{number:03d} {tenant} document ".ljust(PROMPT_CHARS, "x")  # no shared first block


def test_sim_stream_is_attributed_and_the_capped_tenant_never_reaches_cpu(
    tmp_path: Path, sim: tuple[ServerProcess, int]
) -> None:
    server, events = sim
    root = write_policies(tmp_path / "policies", {"offload": [f"tcp://127.0.0.1:{events}"]}, TENANTS)
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            for number in range(8):  # 8 x 32 blocks per tenant through a 96-block GPU cache: evictions
                for tenant in ("acme", "globex"):
                    await asyncio.to_thread(_complete, server, tenant, _prompt(tenant, number))
            report = await eventually(ledger.audit, lambda r: _settled(r))
            globex, acme = report["tenants"]["globex"], report["tenants"]["acme"]
            assert counts(report, "globex", "CPU") == (0, 0, 0)
            assert globex["GPU"]["stored"] > 0 and acme["GPU"]["removed"] > 0
            assert acme["CPU"]["stored"] > 0 and acme["CPU"]["violations"] == {"age": 0, "medium": 0}
            assert "unattributed" not in report["tenants"]
            assert report["gaps"][0]["missing_batches"] == 0
            _check_metrics(ledger)

    asyncio.run(scenario())


def _settled(report: dict[str, Any]) -> bool:
    acme_gpu, acme_cpu = counts(report, "acme", "GPU"), counts(report, "acme", "CPU")
    return acme_gpu[0] == 8 * 32 and acme_cpu[0] == 8 * 8 and counts(report, "globex", "GPU")[0] == 8 * 32


def _check_metrics(ledger: Running) -> None:
    assert ledger.sample("kvgate_kv_blocks_stored_total", tenant="globex", medium="CPU") == 0
    assert ledger.sample("kvgate_kv_blocks_stored_total", tenant="acme", medium="CPU") == 64
    assert ledger.sample("kvgate_retention_violations_total", tenant="globex", kind="medium") == 0
