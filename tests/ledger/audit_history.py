"""One ledger history that exercises every way a record opens, turns unknown and closes, and the two reports
built from it: from every record (the reference) and from the store's own totals (what `/admin/audit` serves)."""

from __future__ import annotations

from typing import Any

from gateway.ledger.audit import collect_audit
from gateway.ledger.base import LedgerStore
from gateway.ledger.records import (
    CONTROL_SEQ,
    BatchOps,
    ClearOp,
    CloseOp,
    CloseReason,
    CopiesOp,
    Op,
    OpenOp,
    ResumeOp,
    SilenceOp,
    TenantPolicyRecord,
)
from gateway.ledger.report import AuditInputs, Window, build_report
from gateway.policy.loader import PolicySet
from gateway.policy.model import GatewayConfig, TenantPolicy

NOW = 10_000.0
OFFSETS = {"p/0": 40.0, "q/0": -2.5}


def audit_policies() -> PolicySet:
    gateway = GatewayConfig.model_validate({"pools": {"p": {"upstreams": ["http://a"], "kv_events": ["tcp://h:1"]}},
                                            "default_pool": "p"})
    tenants: dict[str, dict[str, Any]] = {
        "acme": {"offload": {"retention_seconds": 100, "allowed_media": ["GPU"]}},
        "globex": {"offload": {"retention_seconds": 30.5}}}
    parsed = {name: TenantPolicy.model_validate({"tenant": name, **body}) for name, body in tenants.items()}
    return PolicySet(gateway=gateway, tenants=parsed, keys={}, version="now")


def history() -> list[BatchOps]:
    """Two sources, three tenants (one gone from policy), epochs and no epoch, every way a record closes, a
    silence and a resume, a duplicate open, lifetimes with fractions, and a removal before the store time."""
    tenants = ("acme", "globex", "gone", "unattributed")
    opens: list[Op] = [OpenOp("GPU" if index % 3 else "CPU", index, None, tenants[index % 4],
                              None if index % 4 == 3 else 1 + index % 2, 1000.0 + 7.25 * index) for index in range(80)]
    closes: list[Op] = [CloseOp("GPU" if index % 3 else "CPU", index, 1000.0 + 7.25 * index + 3.5 * (index % 40))
                        for index in range(0, 80, 3)]
    other: list[Op] = [OpenOp("GPU", 500 + index, None, "acme", 2, 2000.0 + index) for index in range(6)]
    return [
        BatchOps("p/0", 0, 1.0, "v", opens), BatchOps("p/0", 1, 2.0, "v", closes),
        BatchOps("q/0", 0, 1.5, "v", [*other, CopiesOp("GPU", 500, 2)]),
        BatchOps("p/0", CONTROL_SEQ, 3.0, "v", [ClearOp(("CPU",), 1300.0, 5000.0, CloseReason.RESET)]),
        BatchOps("q/0", 1, 2.5, "v", [CloseOp("GPU", 501, 1999.5), ClearOp(("GPU",), 2003.0, 2010.25,
                                                                            CloseReason.CLEARED)]),
        BatchOps("q/0", CONTROL_SEQ, 4.0, "v", [SilenceOp(8000.0)]),
        BatchOps("q/0", CONTROL_SEQ, 4.5, "v", [ResumeOp(8100.0)]),
        BatchOps("p/0", CONTROL_SEQ, 5.0, "v", [SilenceOp(9000.0)]),
        BatchOps("p/0", 2, 6.0, "v", [OpenOp("GPU", 999, None, "acme", 2, 9500.0)]),
        # Block 1 is still open: a second open of it (another replica's view) must not count twice.
        BatchOps("p/0", 3, 7.0, "v", [OpenOp("GPU", 1, None, "globex", 1, 9600.0),
                                      OpenOp("GPU", 1000, None, "globex", 1, 9600.0)]),
        BatchOps("q/0", CONTROL_SEQ, 8.0, "v", [ClearOp(None, 2005.0, 9700.0, CloseReason.RESTART)]),
    ]


async def scan_and_summary(store: LedgerStore) -> tuple[dict[str, Any], dict[str, Any]]:
    """The report from every record (the reference) and the one `/admin/audit` serves from the totals."""
    policies = audit_policies()
    await store.record_clock(OFFSETS, NOW)
    await store.remember_policies([TenantPolicyRecord("gone", 50.0, ("GPU",), "old", 1.0)])
    inputs = AuditInputs(await store.records(None, None), await store.missing_batches(), await store.source_events(),
                         OFFSETS, await store.tenant_policies())
    scanned = build_report(inputs, policies, Window(NOW, None), None)
    return scanned, await collect_audit(store, policies, None, None, OFFSETS, now=NOW)


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in report.items() if key not in ("generated_at", "compacted_before")}


