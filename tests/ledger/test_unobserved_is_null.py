"""What the ledger has not observed is reported as unknown, never as 0: a medium whose blocks are all still
resident has no lifetime yet (null, not an instant one), and a medium with no open block has no oldest
resident age (null, not a fresh block). Over both store backends, the summarised and the windowed report,
and the CLI's table and CSV forms."""

from __future__ import annotations

import asyncio
import csv
import io
from datetime import UTC, datetime
from typing import Any

from gateway.cli.audit import COLUMNS, render
from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore
from gateway.ledger.records import BatchOps, CloseOp, OpenOp
from gateway.ledger.redis_store import RedisStore
from gateway.ledger.sqlite_store import SqliteStore
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy
from tests.ledger.support import Backend

NOW = 10_000.0
LIFETIMES = ("lifetime_p50_s", "lifetime_p99_s", "lifetime_max_s")


def _policies() -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"], "kv_events": ["tcp://h:1"]}},
                                            "default_pool": "p"})
    acme = TenantPolicy.model_validate({"tenant": "acme", "offload": {"retention_seconds": 3600}})
    return PolicySet(gateway=gateway, tenants={"acme": acme}, keys={}, version="v")


async def _open(backend: Backend) -> LedgerStore:
    if backend.redis_url is not None:
        return await RedisStore.open(backend.redis_url, prefix=backend.prefix)
    return await SqliteStore.open(backend.state_path)


async def _audits(backend: Backend) -> tuple[dict[str, Any], dict[str, Any]]:
    """GPU: two blocks stored, none removed. CPU: one block stored and removed after 40 s, none open."""
    store = await _open(backend)
    try:
        await store.apply([
            BatchOps("p/0", 0, 1.0, "v", [OpenOp("GPU", 1, None, "acme", 0, 9_000.0),
                                          OpenOp("GPU", 2, None, "acme", 0, 9_500.0),
                                          OpenOp("CPU", 3, None, "acme", 0, 9_000.0)]),
            BatchOps("p/0", 1, 2.0, "v", [CloseOp("CPU", 3, 9_040.0)]),
        ])
        summarised = await collect_audit(store, _policies(), None, None, now=NOW)
        windowed = await collect_audit(store, _policies(), None, datetime.fromtimestamp(0.0, UTC), now=NOW)
        return summarised, windowed
    finally:
        await store.close()


def test_a_medium_with_only_resident_blocks_has_no_lifetime_and_one_without_open_blocks_no_oldest_age(
    backend: Backend,
) -> None:
    for report in asyncio.run(_audits(backend)):
        gpu, cpu = report["tenants"]["acme"]["GPU"], report["tenants"]["acme"]["CPU"]
        assert (gpu["resident"], gpu["removed"]) == (2, 0)
        assert [gpu[name] for name in LIFETIMES] == [None, None, None]
        assert gpu["oldest_resident_age_s"] == 1_000.0
        assert (cpu["resident"], cpu["removed"]) == (0, 1)
        assert [cpu[name] for name in LIFETIMES] == [40.0, 40.0, 40.0]
        assert cpu["oldest_resident_age_s"] is None


def test_the_cli_prints_unknown_where_the_json_has_null(backend: Backend) -> None:
    summarised, _ = asyncio.run(_audits(backend))
    rows = {(row["tenant"], row["medium"]): row for row in csv.DictReader(io.StringIO(render(summarised, "csv")))}
    assert [rows["acme", "GPU"][name] for name in LIFETIMES] == ["unknown"] * 3
    assert rows["acme", "GPU"]["oldest_resident_age_s"] == "1000.0"
    assert rows["acme", "CPU"]["oldest_resident_age_s"] == "unknown"
    assert rows["acme", "CPU"]["lifetime_p50_s"] == "40.0"
    table = render(summarised, "table").splitlines()
    header = table[1].split()
    assert tuple(header) == COLUMNS
    cells = {(cols[0], cols[1]): dict(zip(header, cols, strict=True)) for cols in map(str.split, table[2:4])}
    assert cells["acme", "GPU"]["lifetime_max_s"] == "unknown"
    assert cells["acme", "CPU"]["oldest_resident_age_s"] == "unknown"
