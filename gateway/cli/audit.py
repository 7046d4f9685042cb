"""`kvgate audit`, `kvgate tenant forget` and `kvgate ledger reset-source`: the ledger from the command line.

`kvgate audit` reads the store directly (SQLite at KVGATE_STATE_PATH, or Redis at KVGATE_REDIS_URL), so it
works whether or not a gateway is running. Run as `python -m gateway.cli.audit` too.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import json
import os
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gateway.isotime import parse_since
from gateway.ledger.audit import collect_audit
from gateway.ledger.config import LedgerSettings
from gateway.ledger.factory import open_store
from gateway.ledger.forget import ForgetError, forget_tenant
from gateway.ledger.report import iso
from gateway.ledger.reset import ResetError, reset_source
from gateway.policy.loader import PolicyLoadError, PolicySet, load_policy_set
from gateway.settings import Settings

COLUMNS = ("tenant", "medium", "stored", "removed", "resident", "unknown", "lifetime_p50_s", "lifetime_p99_s",
           "lifetime_max_s", "oldest_resident_age_s", "age_violations", "medium_violations")


def add_audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument("--since", type=parse_since, help="ISO time; blocks resident then or removed since")
    parser.add_argument("--format", choices=("table", "json", "csv"), default="table")
    parser.add_argument("--policies", type=Path, help="policy directory (env KVGATE_POLICIES, default ./policies)")


def add_tenant_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="tenant_action", metavar="ACTION", required=True)
    forget = actions.add_parser("forget", help="raise the tenant's salt epoch: earlier cached blocks become "
                                "unreachable; `kvgate audit` shows them draining")
    forget.add_argument("tenant")
    forget.add_argument("--policies", type=Path, help="policy directory (env KVGATE_POLICIES, default ./policies)")


def run_audit(args: argparse.Namespace) -> int:
    settings = Settings()
    policies = _load_policies(args.policies or settings.policies)
    if policies is None:
        return 1
    if args.tenant is not None and args.tenant not in policies.tenants and args.tenant != "unattributed":
        print(f"unknown tenant {args.tenant!r}", file=sys.stderr)
        return 1
    try:
        report = asyncio.run(_read_report(settings, policies, args.tenant, args.since))
    except Exception as error:  # the store cannot be read: say so, exit 1, no traceback
        print(f"the ledger store cannot be read: {error!r}"[:500], file=sys.stderr)
        return 1
    sys.stdout.write(render(report, args.format))
    return 0


def run_tenant(args: argparse.Namespace) -> int:
    directory = args.policies or Settings().policies
    try:
        change = forget_tenant(directory, args.tenant)
    except (ForgetError, OSError, ValueError) as error:
        print(str(error), file=sys.stderr)
        return 1
    print(f"{change.tenant}: cache.salt_epoch {change.old_epoch} -> {change.new_epoch} in {change.path}")
    try:
        erased = asyncio.run(erase_reuse_trace(Settings(), change.tenant))
    except Exception as error:  # the epoch is raised; say plainly that the trace is not yet erased
        print(f"could not erase the reuse trace of {change.tenant}: {type(error).__name__}: {error}; a running "
              "gateway erases it when it reloads the policy", file=sys.stderr)
        return 1
    print(f"erased {erased} reuse-trace records of {change.tenant} (a running gateway also drops what it holds)")
    print("A running gateway reloads it within 2 s; blocks cached under earlier epochs can no longer be hit.")
    print(f"Watch them drain: kvgate audit --tenant {change.tenant}")
    return 0


async def erase_reuse_trace(settings: Settings, tenant: str) -> int:
    from gateway.reuse.store import trace_store_for

    if not settings.redis_url and not settings.state_path.exists():
        return 0
    async with trace_store_for(settings.redis_url, settings.state_path) as store:
        return await store.erase(tenant)


def _load_policies(directory: Path) -> PolicySet | None:
    try:
        return load_policy_set(directory)
    except PolicyLoadError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return None


async def _read_report(
    settings: Settings, policies: PolicySet, tenant: str | None, since: datetime | None
) -> dict[str, Any]:
    store = await open_store(settings, LedgerSettings().redis_prefix)
    try:
        return await collect_audit(store, policies, tenant, since)
    finally:
        await store.close()


def render(report: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report, indent=2) + "\n"
    rows = list(_rows(report))
    return _csv(rows) if fmt == "csv" else _table(report, rows)


def _rows(report: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = []
    for tenant, media in report["tenants"].items():
        if "not_auditable" in media:
            rows.append((tenant, media["not_auditable"], *[""] * (len(COLUMNS) - 2)))
            continue
        for medium, view in media.items():
            violations = view["violations"]
            rows.append((tenant, medium, view["stored"], view["removed"], view["resident"], view["unknown"],
                         *(_known(view[name]) for name in UNKNOWABLE), violations["age"], violations["medium"]))
    return rows


UNKNOWABLE = ("lifetime_p50_s", "lifetime_p99_s", "lifetime_max_s", "oldest_resident_age_s")


def _known(value: float | None) -> float | str:
    """null in the JSON (nothing removed in the window, nothing open): "unknown", never a 0 that reads as data."""
    return "unknown" if value is None else value


def _csv(rows: list[tuple[Any, ...]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    writer.writerows(rows)
    return buffer.getvalue()


def _table(report: dict[str, Any], rows: list[tuple[Any, ...]]) -> str:
    cells = [COLUMNS, *[tuple(str(value) for value in row) for row in rows]]
    widths = [max(len(str(row[i])) for row in cells) for i in range(len(COLUMNS))]
    lines = [f"policy version {report['policy_version']}, generated {report['generated_at']}"]
    if writes := report.get("writes_during_read", 0):
        lines += [f"read while {writes} ledger writes landed: a block changed meanwhile may be counted in its "
                  "earlier state, its later one, both or neither"]
    lines += ["  ".join(str(value).rjust(width) for value, width in zip(row, widths, strict=True)) for row in cells]
    lines += [f"source {gap['source']}: {gap['missing_batches']} missing batches, {gap['restarts']} restarts "
              f"({gap['restarts_presumed']} more presumed), "
              f"{gap['lost']} silences, {gap['resets']} operator resets, clock offset "
              f"{_offset(gap['clock_offset_s'])}{_in_progress(gap.get('changes_in_progress', []))}"
              for gap in report["gaps"]]
    lines += [f"{tenant} {medium} epoch {epoch}: drain not proven: {'; '.join(view['drain']['reasons'])}"
              for tenant, media in report["tenants"].items() if "not_auditable" not in media
              for medium, medium_view in media.items() for epoch, view in medium_view["epochs"].items()
              if view["drain"]["reasons"] and (view["resident"] == 0 or view["unknown"])]
    lines += [f"{tenant}: no longer in the policy set; judged against policy version {version}"
              for tenant, version in report.get("judged_against_last_policy", {}).items()]
    lines += [f"pool {pool}: unobserved: {'; '.join(what)}" for pool, what in report.get("unobserved", {}).items()]
    return "\n".join(lines) + "\n"


def _in_progress(kinds: list[str]) -> str:
    """Whole-source changes part applied when the report was read: that source's counts are part way."""
    return f"; in progress, counts part way: {', '.join(kinds)}" if kinds else ""


def _offset(value: float | None) -> str:
    return "not estimated yet" if value is None else f"{value:+.3f} s"


def add_ledger_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="ledger_action", metavar="ACTION", required=True)
    reset = actions.add_parser("reset-source", help="record a tier reset vLLM does not announce (CPU tier): "
                               "the source's open records on that medium close as `reset`")
    reset.add_argument("source", help="source name as the audit shows it, e.g. offload/0")
    reset.add_argument("--medium", action="append", required=True, type=str.upper,
                       help="medium that was reset (repeatable), e.g. CPU")


def run_ledger(args: argparse.Namespace) -> int:
    media = tuple(dict.fromkeys(args.medium))
    try:
        result = asyncio.run(_reset(Settings(), args.source, media))
    except ResetError as error:
        print(str(error), file=sys.stderr)
        return 1
    offset = _offset(result.clock_offset_s)
    print(f"{result.source}: {result.closed} open records on {', '.join(result.media)} closed as reset "
          f"(stored before {iso(result.stored_before)} by the publisher's clock; clock offset {offset})")
    return 0


async def _reset(settings: Settings, source: str, media: tuple[str, ...]) -> Any:
    store = await open_store(settings, LedgerSettings().redis_prefix)
    try:
        return await reset_source(store, source, media)
    finally:
        await store.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    add_audit_arguments(commands.add_parser("audit", help="the block-lifecycle report"))
    add_tenant_arguments(commands.add_parser("tenant", help="tenant tools"))
    add_ledger_arguments(commands.add_parser("ledger", help="ledger tools (reset-source)"))
    args = parser.parse_args(argv)
    runners = {"audit": run_audit, "tenant": run_tenant, "ledger": run_ledger}
    return runners[args.command](args)


if __name__ == "__main__":
    os.environ.setdefault("KVGATE_LOG_FORMAT", "console")
    sys.exit(main())
