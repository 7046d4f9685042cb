"""Continuity is proved through replay, never assumed from sequence numbers alone: a publisher restarted
while no gateway listened (the new process already past the stored cursor), a restarted publisher whose clock
is behind, and a new process whose first batches already left its replay buffer. Real ZMQ sockets, both
store backends."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, placeholder, removed, stored
from tests.ledger.support import SECRET, Backend, counts, eventually, running_ledger, write_policies

TENANTS: dict[str, dict[str, Any]] = {"acme": {}, "globex": {}}


def _salt(tenant: str) -> str:
    return expected_salt(SECRET, tenant, 1)


def _policies(tmp_path: Path, publisher: VllmPublisher) -> Path:
    return write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)


def _old_process(publisher: VllmPublisher, now: float) -> None:
    """seq 0..2: acme 1, 2 on GPU and 2 on CPU; globex 3."""
    publisher.publish([stored([1, 2], salt=_salt("acme"))], ts=now - 100)
    publisher.publish([placeholder(2)], ts=now - 99)
    publisher.publish([stored([3], salt=_salt("globex"))], ts=now - 98)


def _new_process(publisher: VllmPublisher, now: float, batches: int) -> None:
    """A new vLLM process: seq from 0 again; each batch stores one acme root block 100 + i."""
    publisher.restart()
    for index in range(batches):
        publisher.publish([stored([100 + index], salt=_salt("acme"))], ts=now - 50 + index)


def test_a_restart_while_the_gateway_was_down_is_found_though_the_new_process_is_ahead(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    root = _policies(tmp_path, publisher)
    now = time.time()

    async def first_run() -> None:
        async with running_ledger(root, backend) as ledger:
            _old_process(publisher, now)
            await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (1, 0, 1))

    async def second_run() -> None:
        async with running_ledger(root, backend) as ledger:
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (7, 2, 5))
            assert counts(report, "acme", "CPU") == (1, 1, 0)
            assert counts(report, "globex", "GPU") == (1, 1, 0)
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {"restart": 2}
            gap = report["gaps"][0]
            assert (gap["restarts"], gap["missing_batches"], gap["closed_without_removal"]) == (1, 0, 4)

    asyncio.run(first_run())
    _new_process(publisher, now, 5)  # seq 0..4: past the stored cursor (seq 2)
    asyncio.run(second_run())


def test_what_the_new_process_replay_lacks_is_a_gap(tmp_path: Path, backend: Backend, publisher: VllmPublisher) -> None:
    root = _policies(tmp_path, publisher)
    now = time.time()

    async def first_run() -> None:
        async with running_ledger(root, backend) as ledger:
            _old_process(publisher, now)
            await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (1, 0, 1))

    async def second_run() -> None:
        async with running_ledger(root, backend) as ledger:
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU")[0] == 5)
            assert counts(report, "acme", "GPU") == (5, 2, 3)  # 1, 2 closed by the restart; 103..105 stored
            assert report["gaps"][0]["missing_batches"] == 3  # seq 0..2 of the new process are gone
            # The cursor's batch is gone while later ones exist: a restart explains it, but so would a replay
            # buffer that moved on. Presumed, labelled so, and no proof of removal for a drain.
            assert (report["gaps"][0]["restarts"], report["gaps"][0]["restarts_presumed"]) == (0, 1)
            gpu = report["tenants"]["acme"]["GPU"]
            assert gpu["closed_by"] == {"restart_presumed": 2}
            assert not gpu["epochs"]["1"]["drain"]["proven"]

    asyncio.run(first_run())
    _new_process(publisher, now, 6)
    publisher.forget([0, 1, 2])  # the new process's first batches already left its replay buffer
    asyncio.run(second_run())


def test_a_restarted_publisher_with_a_clock_behind_is_not_taken_for_duplicates(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    now = time.time()

    async def scenario() -> None:
        # No idle probe during the test: the live stream alone must reveal the restart.
        async with running_ledger(_policies(tmp_path, publisher), backend, probe_interval_s=3600) as ledger:
            _old_process(publisher, now)
            await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (1, 0, 1))
            publisher.restart()
            # The new host's clock is 10 minutes behind: its seq 0 and 1 look "older" than what was handled.
            publisher.publish([stored([200], salt=_salt("acme"))], ts=now - 700)
            publisher.publish([stored([201], salt=_salt("globex")), removed([200])], ts=now - 699)
            report = await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (2, 1, 1))
            assert counts(report, "acme", "GPU") == (3, 3, 0)
            assert report["tenants"]["acme"]["GPU"]["closed_by"] == {"restart": 2, "removed": 1}
            assert report["gaps"][0]["restarts"] == 1

    asyncio.run(scenario())


def test_the_same_process_after_a_gateway_restart_is_proven_and_continued(
    tmp_path: Path, backend: Backend, publisher: VllmPublisher
) -> None:
    root = _policies(tmp_path, publisher)
    now = time.time()

    async def first_run() -> None:
        async with running_ledger(root, backend) as ledger:
            _old_process(publisher, now)
            await eventually(ledger.audit, lambda r: counts(r, "globex", "GPU") == (1, 0, 1))

    async def second_run() -> None:
        async with running_ledger(root, backend) as ledger:
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (3, 1, 2))
            assert report["gaps"][0]["restarts"] == 0 and report["gaps"][0]["missing_batches"] == 0
            assert counts(report, "globex", "GPU") == (1, 0, 1)

    asyncio.run(first_run())
    publisher.publish([removed([1]), stored([4], parent=2)], ts=now - 10)  # the same process goes on
    asyncio.run(second_run())
