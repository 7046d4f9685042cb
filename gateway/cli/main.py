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
    arguments = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(chosen_command(arguments))
    args = parser.parse_args(arguments)
    command: Command | None = getattr(args, "command", None)
    if command is None:
        parser.print_help()
        return 2
    return command(args)


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named on the line (its first word that is not an option), if it is one of ours."""
    first = next((word for word in argv if not word.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Every command is listed; only `chosen` (all of them when None) gets its arguments. A command's arguments
    come from its own module, and `kvgate serve` must not import the others (the simulator, the load generator,
    the doctor's HTTP client): they would stay resident in the served gateway for nothing."""
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    commands = parser.add_subparsers(metavar="COMMAND")
    for name, (help_text, configure) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text)
        if chosen is None or chosen == name:
            configure(command)
    return parser


def _add_serve(serve: argparse.ArgumentParser) -> None:
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


def _add_policy(parser: argparse.ArgumentParser) -> None:
    policy = parser.add_subparsers(metavar="ACTION")
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


def _add_keys(parser: argparse.ArgumentParser) -> None:
    keys = parser.add_subparsers(metavar="ACTION")
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


def _add_sim(sim: argparse.ArgumentParser) -> None:
    from gateway.sim import cli as sim_cli

    sim_cli.add_arguments(sim)
    sim.set_defaults(command=sim_cli.run)


def _add_shadow(shadow: argparse.ArgumentParser) -> None:
    from gateway.shadow import cli as shadow_cli

    shadow_cli.add_arguments(shadow)


def _add_audit(audit: argparse.ArgumentParser) -> None:
    from gateway.cli import audit as audit_cli

    audit_cli.add_audit_arguments(audit)
    audit.set_defaults(command=audit_cli.run_audit)


def _add_tenant(tenant: argparse.ArgumentParser) -> None:
    from gateway.cli import audit as audit_cli

    audit_cli.add_tenant_arguments(tenant)
    tenant.set_defaults(command=audit_cli.run_tenant)


def _add_ledger(ledger: argparse.ArgumentParser) -> None:
    from gateway.cli import audit as audit_cli

    audit_cli.add_ledger_arguments(ledger)
    ledger.set_defaults(command=audit_cli.run_ledger)


def _add_demo(demo: argparse.ArgumentParser) -> None:
    demo.set_defaults(command=_demo)


def _add_loadtest(loadtest: argparse.ArgumentParser) -> None:
    from gateway.cli import loadtest as loadtest_cli

    loadtest_cli.add_arguments(loadtest)
    loadtest.set_defaults(command=loadtest_cli.run)


def _add_canary(canary: argparse.ArgumentParser) -> None:
    from gateway.cli import canary as canary_cli

    canary_cli.add_arguments(canary)


def _add_doctor(parser: argparse.ArgumentParser) -> None:
    from gateway.cli import doctor

    doctor.add_arguments(parser)


def _add_plan(plan: argparse.ArgumentParser) -> None:
    from gateway.plan import cli as plan_cli

    plan_cli.add_arguments(plan)


def _demo(args: argparse.Namespace) -> int:
    from gateway.devtools.demo import run_demo

    result: int = run_demo()
    return result


# name → (help, what adds its arguments); listed in this order by `kvgate --help`
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "serve": ("run the gateway", _add_serve),
    "policy": ("policy directory tools", _add_policy),
    "keys": ("API key tools", _add_keys),
    "sim": ("run a simulated vLLM server", _add_sim),
    "shadow": ("shadow A/B reports", _add_shadow),
    "audit": ("block-lifecycle report from the ledger", _add_audit),
    "tenant": ("tenant tools (forget)", _add_tenant),
    "ledger": ("ledger tools (reset-source)", _add_ledger),
    "demo": ("simulated offload + control servers, gateway, workload, report", _add_demo),
    "loadtest": ("offload A/B protocol through the gateway, with a report", _add_loadtest),
    "canary": ("probe tenant isolation on every pool now", _add_canary),
    "doctor": ("what each upstream says: version, max_load_tokens, offload tier, kv_load_failure_policy",
               _add_doctor),
    "plan": ("how much RAM the CPU offload tier should get", _add_plan),
}
