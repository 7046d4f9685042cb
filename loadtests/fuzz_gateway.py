"""Fuzz a served gateway in front of `kvgate sim` with generated requests (loadtests/fuzz_requests.py).

Counts every status, every 500 (the simulator is never told to fail, so any 500 is the gateway's own) and
every request answered without a status line; afterwards reads the gateway's log for lines that are not
JSON, error-level lines and requests logged with outcome `internal_error`. The gateway's RSS is sampled
every 1,000 requests.

    .venv/bin/python -m loadtests.fuzz_gateway --examples 10000 \
        --out loadtests/reports/hardening-2026-12-01/fuzz.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, given, settings

from loadtests.fuzz_requests import Credentials, Reply, requests, send_raw
from loadtests.hardening_stack import gateway_stack, raise_open_files, rss_mib, simulator
from loadtests.results import print_and_write_json

FUZZ_TENANTS: dict[str, dict[str, Any]] = {
    "acme": {"cache": {"isolation": "user"}, "rollout": {"user_header": "x-end-user"}, "measure_ttft": True,
             "offload": {"max_load_tokens": 64}},
}


def log_findings(log: Path) -> dict[str, Any]:
    not_json, errors, internal = 0, Counter[str](), 0
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            not_json += 1
            continue
        if not isinstance(entry, dict):
            not_json += 1
            continue
        if entry.get("level") in ("error", "critical"):
            errors[str(entry.get("event"))] += 1
        if entry.get("outcome") == "internal_error":
            internal += 1
    return {"lines_not_json": not_json, "error_lines": dict(errors), "internal_error_requests": internal}


def fuzz(port: int, keys: Credentials, examples: int, pid: int) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    codes: Counter[str] = Counter()
    server_errors: list[dict[str, Any]] = []
    rss: list[float] = []

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(request=requests(keys))
    def one(request: bytes) -> None:
        reply: Reply = send_raw(port, request)
        statuses[str(reply.status)] += 1
        codes[str(reply.gateway_error_code)] += 1
        if reply.status is None or reply.status >= 500:
            server_errors.append({"status": reply.status, "request_head": request.split(b"\r\n\r\n")[0][:300]
                                  .decode("latin-1"), "reply": (reply.head + b"\r\n\r\n" + reply.body)[:300]
                                  .decode("latin-1")})
        if sum(statuses.values()) % 1000 == 0:
            rss.append(round(rss_mib(pid), 1))

    started = time.monotonic()
    rss.append(round(rss_mib(pid), 1))
    one()
    return {"requests": sum(statuses.values()), "seconds": round(time.monotonic() - started, 1),
            "statuses": dict(sorted(statuses.items())), "error_codes": dict(codes.most_common()),
            "status_500_or_none": len([e for e in server_errors if e["status"] in (500, None)]),
            "server_errors": server_errors[:20], "rss_mib_every_1000": rss}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.fuzz_gateway", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--work", type=Path, default=Path("/tmp/kvgate-fuzz"))
    args = parser.parse_args(argv)
    raise_open_files()
    env = {"KVGATE_LOG_LEVEL": "info"}
    with gateway_stack(args.work, simulator(args.work), FUZZ_TENANTS, env) as stack:
        keys = Credentials(inference=stack.keys["acme"], ops=stack.keys["ops"])
        result = fuzz(stack.gateway.port, keys, args.examples, stack.gateway.popen.pid)
    result["log"] = log_findings(args.work / "gateway.log")
    print_and_write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
