"""The real vLLM 0.25.0 captures replayed through the whole ledger: sockets, decoder, lifecycle, store.

The samples skip most of each run's messages, and the publisher here has only the sampled batches to
replay, so every skipped sequence number must be reported missing; each stored hash counts once while
resident; the one captured salt (remembered as a user salt of `tenant-b`) attributes its chain on the GPU
and, through the placeholder hashes, on the CPU tier.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from gateway.ledger.records import SaltDigestEntry
from gateway.ledger.salts import salt_digest
from gateway.ledger.sqlite_store import SqliteStore
from tests.kvevents.fixtures import SERVERS, Captured, captured
from tests.ledger.publisher import VllmPublisher
from tests.ledger.support import Backend, eventually, running_ledger, write_policies

CAPTURED_SALT = {"offload": "tenant-b-offload-0", "control": "tenant-b-control-0", "selfdesc": "tenant-b-selfdesc-0"}


def _payload(item: Captured) -> bytes:
    frames = item.frames
    return bytes(frames[-1]) if frames is not None else msgspec.msgpack.encode(item.decoded)


def _reference(items: list[Captured]) -> dict[str, int]:
    """What a set-of-resident-blocks reading of the sample gives, to compare the ledger against."""
    resident: set[tuple[str, int]] = set()
    stored = 0
    for item in {item.seq: item for item in items}.values():
        for event in item.decoded[1]:
            keys = {(str(event.get("medium", "GPU")).upper(), block) for block in event.get("block_hashes", [])}
            if event["type"] == "BlockStored":
                stored += len(keys - resident)
                resident |= keys
            elif event["type"] == "BlockRemoved":
                resident -= keys
    seqs = {item.seq for item in items}
    return {"stored": stored, "resident": len(resident), "missing": max(seqs) + 1 - len(seqs)}


def _totals(report: dict[str, Any]) -> tuple[int, int]:
    views = [view for media in report["tenants"].values() for view in media.values()]
    return sum(view["stored"] for view in views), sum(view["resident"] for view in views)


@pytest.mark.parametrize("server", SERVERS)
def test_captured_stream_through_the_ledger(tmp_path: Path, server: str) -> None:
    items = captured(server)
    expected = _reference(items)
    publisher = VllmPublisher()
    root = write_policies(tmp_path / "policies", {"pool": [publisher.endpoint]}, {"tenant-b": {}})
    backend = Backend("sqlite", tmp_path / "ledger.sqlite3")

    async def scenario() -> None:
        store = await SqliteStore.open(backend.state_path)  # the salt kvgate "issued", as the request path would
        if server in CAPTURED_SALT:
            await store.remember_salts([SaltDigestEntry("tenant-b", 0, salt_digest(CAPTURED_SALT[server]))])
        await store.close()
        async with running_ledger(root, backend) as ledger:
            for item in items:
                publisher.publish_payload(_payload(item), seq=item.seq)
            # Until every batch is handled: trailing batches may only remove blocks or follow a gap.
            report = await eventually(ledger.audit, lambda r: (*_totals(r), r["gaps"][0]["missing_batches"]) == (
                expected["stored"], expected["resident"], expected["missing"]))
            assert _totals(report) == (expected["stored"], expected["resident"])
            assert report["gaps"][0]["missing_batches"] == expected["missing"]
            _check_attribution(server, report)

    try:
        asyncio.run(scenario())
    finally:
        publisher.stop()


def _check_attribution(server: str, report: dict[str, Any]) -> None:
    tenant = report["tenants"]["tenant-b"]
    if server in CAPTURED_SALT:
        assert tenant["GPU"]["stored"] >= 500  # the salted 8000-token prompt
    if server == "offload":
        assert tenant["CPU"]["stored"] == 125  # its 64-token chunks, by their last GPU block hash
    if server == "selfdesc":
        assert tenant["CPU"]["stored"] == 500  # self-describing CPU blocks carry the GPU hashes themselves
    if server == "cli":
        assert tenant["GPU"]["stored"] == 0  # nothing salted in this sample: all unattributed
