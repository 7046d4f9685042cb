"""`kvgate canary`: ask a running gateway to probe its pools now, and print the outcomes.

Exit status: 0 when every probe passed, 1 when any failed (isolation broken), 2 otherwise (errors or
inconclusive probes, or the gateway could not be asked).
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx

from gateway.tables import table

ADMIN_KEY_ENV = "KVGATE_ADMIN_KEY"
COLUMNS = ("pool", "upstream", "result", "cached_tokens_a", "cached_tokens_b", "external_hits_delta_b")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the gateway (default %(default)s)")
    parser.add_argument("--pool", help="probe only this pool (default: every pool)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the probes")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    key = os.environ.get(ADMIN_KEY_ENV)
    if not key:
        print(f"set {ADMIN_KEY_ENV} to a key with the admin scope", file=sys.stderr)
        return 2
    params = {"pool": args.pool} if args.pool else {}
    try:
        response = httpx.post(f"{args.url.rstrip('/')}/admin/canary", params=params, timeout=args.timeout,
                              headers={"authorization": f"Bearer {key}"})
    except httpx.HTTPError as error:
        print(f"could not reach the gateway: {type(error).__name__}", file=sys.stderr)
        return 2
    if response.status_code != 200:
        print(f"gateway answered {response.status_code}: {response.text[:300]}", file=sys.stderr)
        return 2
    outcomes = response.json()["outcomes"]
    print(table(COLUMNS, [[o.get(c) for c in COLUMNS] for o in outcomes]))
    return _status({o["result"] for o in outcomes})


def _status(results: set[str]) -> int:
    if "fail" in results:
        return 1
    return 0 if results <= {"pass"} and results else 2
