"""`kvgate` command line. The only module that exits the process."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gateway.connectors.capabilities import connector_warnings
from gateway.epochs.floor import FloorStoreUnavailable, floor_problems
from gateway.keys import hash_key, new_key, policy_line
from gateway.policy.advice import policy_warnings
from gateway.policy.loader import PolicyLoadError, load_policy_set, missing_credentials
from gateway.settings import Settings

Command = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    command: Command | None = getattr(args, "command", None)
    if command is None:
        parser.print_help()
        return 2
    return command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    commands = parser.add_subparsers(metavar="COMMAND")
    _add_serve(commands)
    _add_policy(commands)
    _add_keys(commands)
    _add_sim(commands)
    _add_shadow(commands)
    _add_audit(commands)
    _add_demo(commands)
    _add_loadtest(commands)
    _add_canary(commands)
    _add_doctor(commands)
    _add_plan(commands)
    return parser


def _add_serve(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--policies", type=Path, help="policy directory (env KVGATE_POLICIES, default ./policies)")
    serve.add_argument("--host", help="listen address (env KVGATE_HOST, default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (env KVGATE_PORT, default 8080)")
    serve.add_argument("--workers", type=int,
                       help="serving processes sharing the port (env KVGATE_WORKERS, default 1: this process)")
    serve.set_defaults(command=_serve)


def _serve(args: argparse.Namespace) -> int:
    from gateway.cli.serve import run_gateway

    flags = ("policies", "host", "port", "workers")
    overrides = {key: value for key in flags if (value := getattr(args, key)) is not None}
    return run_gateway(overrides)


def _add_policy(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = commands.add_parser("policy", help="policy directory tools").add_subparsers(metavar="ACTION")
    check = policy.add_parser("check", help="validate a policy directory")
    check.add_argument("directory", type=Path)
    check.set_defaults(command=_policy_check)


def _policy_check(args: argparse.Namespace) -> int:
    try:
        policies = load_policy_set(args.directory)
    except PolicyLoadError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 1
    settings = Settings()
    try:
        below = asyncio.run(floor_problems(settings.redis_url, settings.state_path, policies))
    except FloorStoreUnavailable as error:
        print(f"warning: the salt-epoch floors could not be read ({error}); not checked", file=sys.stderr)
        below = []
    for problem in below:
        print(problem, file=sys.stderr)
    if below:
        return 1
    for warning in policy_warnings(policies):
        print(f"warning: {warning}", file=sys.stderr)
    for pool in missing_credentials(policies.gateway, os.environ):
        variable = policies.gateway.pools[pool].api_key_env
        print(f"warning: pools.{pool}.api_key_env: ${variable} is not set here; `kvgate serve` refuses to start "
              "(and a reload is rejected) until it is", file=sys.stderr)
    print(f"ok: {len(policies.tenants)} tenants, {len(policies.gateway.pools)} pools, version {policies.version}")
    for line in connector_warnings(policies):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def _add_keys(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = commands.add_parser("keys", help="API key tools").add_subparsers(metavar="ACTION")
    new = keys.add_parser("new", help="print a fresh key once, and the line for the tenant's policy")
    new.add_argument("tenant")
    new.set_defaults(command=_keys_new)
    keys.add_parser("hash", help="read a key on stdin, print its hash").set_defaults(command=_keys_hash)


def _keys_new(args: argparse.Namespace) -> int:
    key = new_key()
    print(f"API key for {args.tenant} (shown once; store it in your secret manager):\n{key}\n")
    print(f"Add under `keys:` in tenants/{args.tenant}.yaml:\n{policy_line(key)}")
    return 0


def _keys_hash(args: argparse.Namespace) -> int:
    key = sys.stdin.readline().strip()
    if not key:
        print("no key on stdin", file=sys.stderr)
        return 1
    print(hash_key(key))
    return 0


def _add_sim(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.sim import cli as sim_cli

    sim = commands.add_parser("sim", help="run a simulated vLLM server")
    sim_cli.add_arguments(sim)
    sim.set_defaults(command=sim_cli.run)


def _add_shadow(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.shadow import cli as shadow_cli

    shadow_cli.add_arguments(commands.add_parser("shadow", help="shadow A/B reports"))


def _add_audit(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli import audit as audit_cli

    audit = commands.add_parser("audit", help="block-lifecycle report from the ledger")
    audit_cli.add_audit_arguments(audit)
    audit.set_defaults(command=audit_cli.run_audit)
    tenant = commands.add_parser("tenant", help="tenant tools (forget)")
    audit_cli.add_tenant_arguments(tenant)
    tenant.set_defaults(command=audit_cli.run_tenant)
    ledger = commands.add_parser("ledger", help="ledger tools (reset-source)")
    audit_cli.add_ledger_arguments(ledger)
    ledger.set_defaults(command=audit_cli.run_ledger)


def _add_demo(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo", help="simulated offload + control servers, gateway, workload, report")
    demo.set_defaults(command=_demo)


def _add_loadtest(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli import loadtest as loadtest_cli

    help_text = "offload A/B protocol through the gateway, with a report"
    loadtest = commands.add_parser("loadtest", help=help_text)
    loadtest_cli.add_arguments(loadtest)
    loadtest.set_defaults(command=loadtest_cli.run)


def _add_canary(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli import canary as canary_cli

    canary_cli.add_arguments(commands.add_parser("canary", help="probe tenant isolation on every pool now"))


def _add_doctor(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.cli import doctor

    help_text = "what each upstream says: version, max_load_tokens, offload tier, kv_load_failure_policy"
    doctor.add_arguments(commands.add_parser("doctor", help=help_text))


def _add_plan(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from gateway.plan import cli as plan_cli

    plan_cli.add_arguments(commands.add_parser("plan", help="how much RAM the CPU offload tier should get"))


def _demo(args: argparse.Namespace) -> int:
    from gateway.devtools.demo import run_demo

    result: int = run_demo()
    return result
