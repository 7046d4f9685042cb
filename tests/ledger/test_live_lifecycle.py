"""Block lifecycles over real ZMQ sockets on both backends: retention, gaps and replay, publisher restarts,
lost sources, and a gateway restart in the middle of a stream."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, cleared, placeholder, removed, stored
from tests.ledger.support import SECRET, Backend, counts, eventually, running_ledger, write_policies

TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"offload": {"retention_seconds": 60, "allowed_media": ["GPU", "CPU"]}},
    "globex": {"offload": {"retention_seconds": 600, "allowed_media": ["GPU"]}},
}


def _salt(tenant: str) -> str:
    return expected_salt(SECRET, tenant, 1)


def _policies(tmp_path: Path, publisher: VllmPublisher) -> Path:
    return write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)


def test_only_blocks_that_outlive_retention_are_violations(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    now = time.time()
    publisher.publish([stored([1, 2], salt=_salt("acme"))], ts=now - 300)  # 1 removed after 200 s, 2 resident
    publisher.publish([stored([3], salt=_salt("acme")), stored([4], salt=_salt("globex"))], ts=now - 100)
    publisher.publish([removed([1]), removed([3]), stored([5], salt=_salt("acme"))], ts=now - 90)
    publisher.publish([placeholder(4)], ts=now - 5)  # globex forbids CPU: a medium violation

    async def scenario() -> None:
        async with running_ledger(_policies(tmp_path, publisher), backend) as ledger:
            report = await eventually(ledger.audit, lambda r: counts(r, "globex", "CPU")[0] == 1)
            acme, globex = report["tenants"]["acme"], report["tenants"]["globex"]
            # 1 lived 210 s (> 60), 2 resident for 300 s (> 60); 3 lived 10 s; 5 resident for 90 s (> 60)
            assert acme["GPU"]["violations"] == {"age": 3, "medium": 0}
            assert acme["GPU"]["lifetime_max_s"] == 210.0 and acme["GPU"]["lifetime_p50_s"] == 10.0
            assert globex["GPU"]["violations"] == {"age": 0, "medium": 0}
            assert globex["CPU"]["violations"] == {"age": 0, "medium": 1}
            # Block 2 was stored at now - 300; its age is judged at the report's own generation time.
            generated = datetime.fromisoformat(report["generated_at"].replace("Z", "+00:00")).timestamp()
            assert acme["GPU"]["oldest_resident_age_s"] == pytest.approx(generated - (now - 300), abs=0.002)
            await eventually(lambda: _value(ledger.sample("kvgate_retention_violations_total", tenant="acme",
                                                          kind="age")), lambda v: v == 3)
            assert ledger.sample("kvgate_retention_violations_total", tenant="globex", kind="medium") == 1
            assert ledger.sample("kvgate_retention_violations_total", tenant="globex", kind="age") == 0

    asyncio.run(scenario())


async def _value(value: float) -> float:
    return value


def test_a_gap_is_recovered_by_replay_and_what_replay_lacks_is_counted(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    async def scenario() -> None:
        async with running_ledger(_policies(tmp_path, publisher), backend) as ledger:
            publisher.publish([stored([1], salt=_salt("acme"))])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 1)
            publisher.publish([stored([2], parent=1)], live=False)  # the SUB never sees seq 1
            publisher.publish([stored([3], parent=2)])
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 3)
            assert report["gaps"][0]["missing_batches"] == 0
            lost = publisher.publish([stored([4], parent=3)], live=False)
            publisher.forget([lost])  # gone from vLLM's replay buffer too
            publisher.publish([stored([5], parent=4)])
            report = await eventually(ledger.audit, lambda r: counts(r, "unattributed", "GPU")[0] == 1)
            assert report["gaps"][0]["missing_batches"] == 1
            assert ledger.sample("kvgate_kv_event_gaps_total", source="offload/0") == 1
            assert counts(report, "acme", "GPU")[0] == 3  # 5's parent was lost with the gap: not guessed

    asyncio.run(scenario())


def test_a_publisher_restart_closes_the_old_process_blocks(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    async def scenario() -> None:
        async with running_ledger(_policies(tmp_path, publisher), backend) as ledger:
            publisher.publish([stored([1, 2], salt=_salt("acme")), placeholder(2)])
            publisher.publish([stored([3], salt=_salt("globex"))])
            await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU")[2] == 1)
            publisher.restart()
            publisher.publish([stored([7], salt=_salt("acme"))])
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (3, 2, 1))
            assert counts(report, "acme", "CPU") == (1, 1, 0)
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {"restart": 2}
            gap = report["gaps"][0]
            assert (gap["restarts"], gap["closed_without_removal"], gap["missing_batches"]) == (1, 4, 0)
            publisher.publish([cleared()])
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[2] == 0)
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {"cleared": 1, "restart": 2}

    asyncio.run(scenario())


def test_a_silent_source_is_unknown_not_removed_and_resumes(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    async def scenario() -> None:
        async with running_ledger(_policies(tmp_path, publisher), backend) as ledger:
            publisher.publish([stored([1, 2], salt=_salt("acme"))])
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[2] == 2)
            publisher.answer_replay = False  # a stalled host: neither events nor replay answers
            report = await eventually(ledger.audit, lambda r: _unknown(r, "acme", "GPU") == 2)
            gpu = report["tenants"]["acme"]["GPU"]
            assert (gpu["removed"], gpu["resident"], gpu["closed_by"]) == (0, 0, {})  # lost is not removed
            epoch = gpu["epochs"]["1"]
            assert epoch["drained_at"] is None and not epoch["drain"]["proven"]
            assert any("unknown" in reason for reason in epoch["drain"]["reasons"])
            assert report["gaps"][0]["lost"] == 1
            publisher.answer_replay = True
            publisher.publish([removed([1])])  # the same process's stream continues
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (2, 1, 1))
            assert _unknown(report, "acme", "GPU") == 0
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {"removed": 1}

    asyncio.run(scenario())


def _unknown(report: dict[str, Any], tenant: str, medium: str) -> int:
    return int(report["tenants"].get(tenant, {}).get(medium, {}).get("unknown", 0))


def test_a_source_that_starts_after_the_gateway_can_still_be_reported_lost(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    publisher.answer_replay = False  # vLLM is not up yet when the gateway starts

    async def scenario() -> None:
        async with running_ledger(_policies(tmp_path, publisher), backend) as ledger:
            block = 0
            while counts(await ledger.audit(), "acme", "GPU")[2] == 0 and block < 400:
                block += 1  # early batches miss a subscriber that is still connecting, and replay is down
                publisher.publish([stored([block], salt=_salt("acme"))])
                await asyncio.sleep(0.05)
            publisher.answer_replay = True  # vLLM's replay endpoint comes up after its first events
            deadline = time.monotonic() + 30
            while publisher.replays_answered == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # polling until the gateway's idle probe has reached it
            publisher.answer_replay = False
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[2] == 0)
            stored_blocks = counts(report, "acme", "GPU")[0]
            assert stored_blocks > 0
            assert _unknown(report, "acme", "GPU") == stored_blocks
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {}

    asyncio.run(scenario())


def test_a_gateway_restart_resumes_from_the_store(tmp_path: Path, backend: Backend, publisher: VllmPublisher) -> None:
    root = _policies(tmp_path, publisher)
    now = time.time()

    async def first_run() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([stored([1, 2], salt=_salt("acme"))], ts=now - 50)
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 2)

    async def second_run() -> None:
        async with running_ledger(root, backend) as ledger:
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (3, 1, 2))
            assert report["tenants"]["acme"]["GPU"]["lifetime_max_s"] == 40.0
            assert report["gaps"][0]["missing_batches"] == 0

    asyncio.run(first_run())
    publisher.publish([removed([1]), stored([3], parent=2)], ts=now - 10)  # while no gateway listens
    asyncio.run(second_run())


def test_copy_counts_survive_a_gateway_restart(tmp_path: Path, backend: Backend, publisher: VllmPublisher) -> None:
    root = _policies(tmp_path, publisher)

    async def first_run() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([stored([1], salt=_salt("acme"))])
            publisher.publish([stored([1], salt=_salt("acme"))])  # vLLM holds a second copy of block 1
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (1, 0, 1))

    async def second_run() -> None:
        async with running_ledger(root, backend) as ledger:
            publisher.publish([removed([1])])  # one copy left: still resident
            publisher.publish([stored([2], salt=_salt("globex"))])
            report = await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (1, 0, 1))
            assert counts(report, "acme", "GPU") == (1, 0, 1)
            publisher.publish([removed([1])])  # the last copy
            await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (1, 1, 0))

    asyncio.run(first_run())
    asyncio.run(second_run())
