"""`kvgate loadtest` (also `python -m gateway.devtools.loadtest`): pick the targets, run the protocol, report."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from gateway.devtools.loadtest.args import add_arguments
from gateway.devtools.loadtest.environment import describe
from gateway.devtools.loadtest.markdown import render_markdown
from gateway.devtools.loadtest.model import ARMS, Scenario, ScenarioError, load_scenario
from gateway.devtools.loadtest.observe import Observer
from gateway.devtools.loadtest.plots import draw_all
from gateway.devtools.loadtest.policies import write_policy_dir
from gateway.devtools.loadtest.progress import Progress
from gateway.devtools.loadtest.reuse import is_reuse_file, run_reuse
from gateway.devtools.loadtest.runner import ProtocolRunner, RawRun
from gateway.devtools.loadtest.stack import self_started_stack
from gateway.devtools.loadtest.summary import build_report
from gateway.devtools.loadtest.targets import Access, CommandRestart, FixedPid, PidFile, Targets, Upstream

DEFAULT_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "default.yaml"


def reports_folder() -> Path:
    """loadtests/reports in a source checkout (the working directory), else a folder of its own."""
    checkout = Path("loadtests") / "reports"
    return checkout if checkout.is_dir() else Path("kvgate-loadtest-reports")


class UsageError(Exception):
    """Flags that do not fit together."""


def _arm_map(pairs: list[tuple[str, str]], flag: str) -> dict[str, str]:
    unknown = sorted({arm for arm, _ in pairs} - set(ARMS))
    if unknown:
        raise UsageError(f"{flag}: unknown arm {unknown[0]!r} (the arms are {', '.join(ARMS)})")
    return dict(pairs)


def external_targets(args: argparse.Namespace) -> Targets:
    if args.access is None:
        raise UsageError("--gateway needs --access keys.json (written by --write-policies, or by hand)")
    urls = _arm_map(args.upstream, "--upstream")
    commands = _arm_map(args.restart_cmd, "--restart-cmd")
    pids = _arm_map(args.pid, "--pid")
    pid_files = _arm_map(args.pid_file, "--pid-file")
    upstreams = {}
    for arm in ARMS:
        pid_source = PidFile(Path(pid_files[arm])) if arm in pid_files else (
            FixedPid(int(pids[arm])) if arm in pids else None)
        hook = CommandRestart(commands[arm]) if arm in commands else None
        upstreams[arm] = Upstream(arm, urls.get(arm, "").rstrip("/") or None, pid_source, hook)
    return Targets(args.gateway.rstrip("/"), Access.load(args.access), upstreams, mode="external (given URLs)")


@contextmanager
def targets_for(args: argparse.Namespace, scenario: Scenario, out: Path) -> Iterator[Targets]:
    if args.gateway is not None:
        yield external_targets(args)
        return
    if args.upstream or args.restart_cmd or args.pid or args.pid_file:
        raise UsageError("--upstream/--restart-cmd/--pid/--pid-file describe an existing stack: add --gateway")
    with self_started_stack(scenario, out / "stack") as targets:
        yield targets


async def drive(scenario: Scenario, targets: Targets, plain: bool) -> RawRun:
    timeout = httpx.Timeout(scenario.timeouts.request_s, connect=10.0)
    async with httpx.AsyncClient(timeout=timeout) as http:
        observer = Observer(http, targets)
        environment = await describe(observer, scenario, targets)
        sizes = [size for size in environment.get("kv_cache_tokens", {}).values() if size]
        pressure = scenario.pressure_prompts(min(sizes) if sizes else None)
        runner = ProtocolRunner(scenario, targets, http, environment, pressure, Progress(0))
        runner.progress = Progress(runner.total_steps(), force_plain=plain)
        runner.progress.note(f"{scenario.name}: {len(scenario.tenants)} tenants x 2 arms, "
                             f"{pressure} pressure prompts per repetition, gateway {targets.gateway_url}")
        try:
            return await runner.run()
        finally:
            runner.progress.close()


def write_outputs(report: dict[str, Any], out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    plots = draw_all(report, out)
    (out / "report.md").write_text(render_markdown(report, plots))
    return plots


def render_existing(folder: Path) -> int:
    report = json.loads((folder / "report.json").read_text())
    plots = draw_all(report, folder)
    (folder / "report.md").write_text(render_markdown(report, plots))
    print(f"redrew {folder / 'report.md'} and {sum(v == 'ok' for v in plots.values())} plots")
    return 0


def write_policies(args: argparse.Namespace, scenario: Scenario) -> int:
    urls = _arm_map(args.upstream, "--upstream")
    if set(urls) != set(ARMS):
        raise UsageError("--write-policies needs --upstream for both arms")
    _arm_map(args.kv_events, "--kv-events")
    events: dict[str, list[str]] = {}
    for arm, endpoint in args.kv_events:
        events.setdefault(arm, []).append(endpoint)
    access = write_policy_dir(args.write_policies, scenario, urls, events)
    access.save(args.write_policies / "keys.json")
    print(f"wrote {args.write_policies}/gateway.yaml, tenants/*.yaml and keys.json (plain keys: keep it private)")
    return 0


def default_out(scenario: Scenario) -> Path:
    return reports_folder() / f"{scenario.name}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def run(args: argparse.Namespace) -> int:
    try:
        if args.render is not None:
            return render_existing(args.render)
        if args.scenario is not None and is_reuse_file(args.scenario):  # `kind: reuse`: see reuse.py
            stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
            return run_reuse(args, reports_folder() / f"{args.scenario.stem}-{stamp}")
        scenario = load_scenario(args.scenario or DEFAULT_SCENARIO)
        if args.write_policies is not None:
            return write_policies(args, scenario)
        out = args.out or default_out(scenario)
        with targets_for(args, scenario, out) as targets:
            raw = asyncio.run(drive(scenario, targets, args.plain))
    except (UsageError, ScenarioError, OSError, RuntimeError, TimeoutError, httpx.HTTPError) as error:
        print(f"kvgate loadtest: {error}", file=sys.stderr)
        return 1
    report = build_report(raw)
    plots = write_outputs(report, out)
    print("\n".join(report["verdict"].values()))
    drawn = sum(status == "ok" for status in plots.values())
    print(f"\nreport: {out / 'report.md'} ({drawn} plots), raw data: {out / 'report.json'}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.devtools.loadtest")
    add_arguments(parser)
    return run(parser.parse_args())
