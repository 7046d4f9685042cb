"""Attribution over real ZMQ sockets, on both store backends: a scripted multi-tenant stream whose
ledger is known exactly, from vLLM-exact frames."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.harness import expected_salt
from tests.ledger.publisher import VllmPublisher, placeholder, removed, stored
from tests.ledger.support import SECRET, Backend, counts, eventually, running_ledger, write_policies

TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"cache": {"isolation": "tenant", "salt_epoch": 1},
             "offload": {"retention_seconds": 3600, "allowed_media": ["GPU", "CPU"]}},
    "globex": {"cache": {"isolation": "user", "salt_epoch": 1},
               "offload": {"max_offload_tokens": 0, "retention_seconds": 600, "allowed_media": ["GPU"]}},
    "initech": {"cache": {"isolation": "tenant", "salt_epoch": 2}},
}


def _chain(first: int, length: int) -> list[int]:
    return [first + index for index in range(length)]


def _script(pub: VllmPublisher) -> None:
    acme, globex_u1, globex_u2 = _chain(1000, 8), _chain(2000, 4), _chain(3000, 2)
    initech_old, initech_new, unsalted = _chain(4000, 3), _chain(5000, 2), _chain(6000, 2)
    pub.publish([stored(acme[:4], salt=expected_salt(SECRET, "acme", 1)),
                 stored(acme[4:], parent=acme[3])])
    pub.publish([stored(globex_u1, salt=expected_salt(SECRET, "globex", 1, "u1")),
                 stored(globex_u2, salt=expected_salt(SECRET, "globex", 1, "u2"))])  # u2 never issued
    pub.publish([stored(initech_old, salt=expected_salt(SECRET, "initech", 1)),
                 stored(initech_new, salt=expected_salt(SECRET, "initech", 2)), stored(unsalted)])
    pub.publish([placeholder(acme[3]), placeholder(acme[7]), placeholder(unsalted[1]), placeholder(99),
                 stored(acme[4:], parent=acme[3], medium="CPU"),  # self-describing: A8 again, counted once
                 stored([7777], medium="cpu", block_size=256)])  # LMCache: lower-case medium, its own hashes
    pub.publish([removed([acme[0]]), stored([acme[1]], parent=acme[0])])  # a duplicate store is no new block


def test_each_block_is_attributed_exactly(tmp_path: Path, backend: Backend, publisher: VllmPublisher) -> None:
    root = write_policies(tmp_path / "policies", {"offload": [publisher.endpoint]}, TENANTS)

    async def scenario() -> None:
        async with running_ledger(root, backend) as ledger:
            ledger.service.remember_user_salt("globex", 1, "u1")
            ledger.service.remember_user_salt("globex", 1, "u1")  # idempotent
            _script(publisher)
            report = await eventually(ledger.audit, lambda r: counts(r, "acme", "GPU") == (8, 1, 7))
            assert counts(report, "acme", "CPU") == (5, 0, 5)
            assert counts(report, "globex", "GPU") == (4, 0, 4)
            assert counts(report, "globex", "CPU") == (0, 0, 0)
            assert counts(report, "initech", "GPU") == (5, 0, 5)
            assert counts(report, "unattributed", "GPU") == (4, 0, 4)
            assert counts(report, "unattributed", "CPU") == (3, 0, 3)
            epochs = report["tenants"]["initech"]["GPU"]["epochs"]
            assert {epoch: view["stored"] for epoch, view in epochs.items()} == {"1": 3, "2": 2}
            assert list(report["tenants"]) == ["acme", "globex", "initech", "unattributed"]
            gap = {key: report["gaps"][0][key] for key in ("source", "missing_batches", "restarts", "lost", "resumed",
                                                            "resets", "closed_without_removal",
                                                            "last_restart_or_loss_at")}
            assert gap == {"source": "offload/0", "missing_batches": 0, "restarts": 0, "lost": 0, "resumed": 0,
                           "resets": 0, "closed_without_removal": 0, "last_restart_or_loss_at": None}
            assert len(report["gaps"]) == 1
            assert ledger.sample("kvgate_kv_blocks_stored_total", tenant="acme", medium="GPU") == 8
            assert ledger.sample("kvgate_kv_blocks_removed_total", tenant="acme", medium="GPU") == 1
            assert ledger.sample("kvgate_kv_blocks_resident", tenant="unattributed", medium="CPU") == 3
            assert SECRET not in str(report) and expected_salt(SECRET, "acme", 1) not in str(report)

    asyncio.run(scenario())
