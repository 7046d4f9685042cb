"""`kvgate shadow report`: the per-tenant paired comparison, read from the store."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gateway.policy.loader import PolicyLoadError, load_policy_set
from gateway.settings import Settings
from gateway.shadow.stats import tenant_summary
from gateway.shadow.store import open_shadow_store
from gateway.shadow.table import shadow_table
from gateway.storage import Storage


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(metavar="ACTION")
    report = actions.add_parser("report", help="ΔTTFT and output agreement per tenant")
    report.add_argument("--policies", type=Path, help="policy directory (env KVGATE_POLICIES)")
    report.add_argument("--tenant", help="only this tenant")
    report.add_argument("--format", choices=("table", "json"), default="table")
    report.set_defaults(command=run_report)


def run_report(args: argparse.Namespace) -> int:
    settings = Settings(**({"policies": args.policies} if args.policies else {}))
    try:
        policies = load_policy_set(settings.policies)
    except PolicyLoadError as error:
        print("\n".join(error.problems), file=sys.stderr)
        return 1
    tenants = [args.tenant] if args.tenant else sorted(policies.tenants)
    report = {"policy_version": policies.version, "tenants": asyncio.run(_summaries(settings, tenants))}
    print(json.dumps(report, indent=2) if args.format == "json" else shadow_table(report))
    return 0


async def _summaries(settings: Settings, tenants: list[str]) -> dict[str, Any]:
    storage = await Storage.open(settings.redis_url, settings.state_path)
    try:
        store = await open_shadow_store(storage)
        return {tenant: tenant_summary(*await store.results(tenant)) for tenant in tenants}
    finally:
        await storage.close()
