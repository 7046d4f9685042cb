"""`kvgate tenant forget` and `kvgate audit` as processes, and an old epoch draining in the audit."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.ledger.forget import with_salt_epoch
from gateway.policy.loader import load_policy_set
from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, placeholder, removed, stored
from tests.ledger.support import SECRET, Backend, Running, counts, eventually, running_ledger, write_policies

REPO_ROOT = Path(__file__).resolve().parents[2]
COMMENTED = """# acme: compliance contact is legal@acme.example
tenant: acme
cache:
  isolation: tenant   # one salt per tenant
  salt_epoch: 1
offload:
  retention_seconds: 3600
"""


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli.audit", *args], capture_output=True, text=True,
                          cwd=REPO_ROOT, env={**os.environ, **(env or {})}, timeout=60, check=False)


@pytest.mark.parametrize(("text", "expected"), [
    (COMMENTED, COMMENTED.replace("salt_epoch: 1", "salt_epoch: 2")),
    ("tenant: acme\ncache:\n  isolation: user\n", "tenant: acme\ncache:\n  salt_epoch: 2\n  isolation: user\n"),
    ("tenant: acme\n", "tenant: acme\ncache:\n  salt_epoch: 2\n"),
    ("tenant: acme\ncache: {isolation: user}\n", "tenant: acme\ncache: {isolation: user, salt_epoch: 2}\n"),
])
def test_raising_the_epoch_changes_only_that_value(text: str, expected: str) -> None:
    assert with_salt_epoch(text, 2) == expected


def test_forget_command_edits_the_policy_file(tmp_path: Path) -> None:
    root = write_policies(tmp_path / "policies", {"offload": []}, {"acme": {}})
    path = root / "tenants" / "acme.yaml"
    path.write_text(COMMENTED.replace("tenant: acme\n", "tenant: acme\nkeys: []\n"))
    result = _cli("tenant", "forget", "acme", "--policies", str(root))
    assert result.returncode == 0, result.stderr
    assert "salt_epoch 1 -> 2" in result.stdout
    assert "# one salt per tenant" in path.read_text()
    assert load_policy_set(root).tenants["acme"].cache.salt_epoch == 2
    assert _cli("tenant", "forget", "nobody", "--policies", str(root)).returncode == 1


def test_old_epoch_drains_after_forget(tmp_path: Path, backend: Backend) -> None:
    publisher = VllmPublisher()
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, {"acme": {}})

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([stored([1, 2], salt=expected_salt(SECRET, "acme", 1)), placeholder(2)])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "CPU")[2] == 1)
            assert _cli("tenant", "forget", "acme", "--policies", str(root)).returncode == 0
            assert ledger.holder.reload()  # what the gateway's watcher does within 2 s
            publisher.publish([stored([3], salt=expected_salt(SECRET, "acme", 2))])
            publisher.publish([removed([1, 2]), removed([2], medium="CPU")])
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "CPU")[2] == 0)
            gpu_epochs, cpu_epochs = (report["tenants"]["acme"][m]["epochs"] for m in ("GPU", "CPU"))
            assert gpu_epochs["1"]["resident"] == 0 and gpu_epochs["1"]["drained_at"] is not None
            assert cpu_epochs["1"]["drained_at"] == cpu_epochs["1"]["last_removed_at"] is not None
            assert gpu_epochs["1"]["drain"] == {"proven": True, "reasons": []}
            assert gpu_epochs["2"] == {"stored": 1, "removed": 0, "resident": 1, "unknown": 0, "last_removed_at": None,
                                       "drained_at": None, "drain": {"proven": False, "reasons": ["1 blocks resident"]}}

    try:
        asyncio.run(scenario())
    finally:
        publisher.stop()
    _check_cli_reports(root, backend)


def _check_cli_reports(root: Path, backend: Backend) -> None:
    env = {"KVGATE_STATE_PATH": str(backend.state_path), "KVGATE_LEDGER_REDIS_PREFIX": backend.prefix}
    if backend.redis_url is not None:
        env["KVGATE_REDIS_URL"] = backend.redis_url
    result = _cli("audit", "--policies", str(root), "--format", "json", env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert set(report) >= {"generated_at", "policy_version", "gaps", "tenants"}
    assert counts(report, "acme", "GPU") == (3, 2, 1)
    assert set(report["tenants"]["acme"]["GPU"]) >= {
        "stored", "removed", "resident", "lifetime_p50_s", "lifetime_p99_s", "lifetime_max_s",
        "oldest_resident_age_s", "violations"}
    rows = list(csv.DictReader(io.StringIO(_cli("audit", "--policies", str(root), "--format", "csv",
                                                "--tenant", "acme", env=env).stdout)))
    assert [(row["medium"], row["stored"]) for row in rows] == [("GPU", "3"), ("CPU", "1")]
    future = _cli("audit", "--policies", str(root), "--since", "2999-01-01T00:00:00", env=env)
    assert future.returncode == 0 and "acme" in future.stdout


def test_reset_source_closes_the_cpu_tier_and_the_gateway_forgets_those_blocks(
    tmp_path: Path, publisher: VllmPublisher
) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, {"acme": {}})
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")
    env = {"KVGATE_STATE_PATH": str(backend.state_path), "KVGATE_POLICIES": str(root)}
    salt = expected_salt(SECRET, "acme", 1)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([stored([1, 2], salt=salt), placeholder(1), placeholder(2)])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "CPU") == (2, 0, 2))
            unknown = await asyncio.to_thread(_cli, "ledger", "reset-source", "nope/0", "--medium", "cpu", env=env)
            assert unknown.returncode == 1 and "unknown source" in unknown.stderr
            done = await asyncio.to_thread(_cli, "ledger", "reset-source", "offload/0", "--medium", "cpu", env=env)
            assert done.returncode == 0, done.stderr
            assert "offload/0: 2 open records on CPU closed as reset" in done.stdout
            report = await ledger.audit()
            assert counts(report, "acme", "CPU") == (2, 2, 0) and counts(report, "acme", "GPU") == (2, 0, 2)
            assert report["tenants"]["acme"]["CPU"]["closed_by"] == {"reset": 2}
            assert report["gaps"][0]["resets"] == 1
            # The running gateway learns of the reset: the same chunk offloaded again is a new record.
            await eventually(lambda: _forgotten(ledger, 1), lambda gone: gone)
            publisher.publish([placeholder(1)])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "CPU") == (3, 2, 1))

    asyncio.run(scenario())


async def _forgotten(ledger: Running, block: int) -> bool:
    return ("CPU", block) not in ledger.service.state.resident("offload/0")
