"""Run the demo end to end and print its report."""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from gateway.devtools.demo.report import phase_table, retention_table, traffic_table
from gateway.devtools.demo.stack import DemoStack, demo_stack
from gateway.devtools.demo.workload import SPLIT_TENANT, run_workload
from gateway.shadow.table import shadow_table


def run_demo() -> int:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvgate-demo-") as workdir:
        print("starting a simulated offload server, a control server and the gateway ...", flush=True)
        try:
            with demo_stack(Path(workdir)) as stack:
                _report(stack, asyncio.run(run_workload(stack.gateway.url, stack.keys)))
        except (RuntimeError, TimeoutError, httpx.HTTPError) as error:
            print(f"demo failed: {error}", file=sys.stderr)
            return 1
    print(f"\ndone in {time.monotonic() - started:.1f} s; every process it started has stopped.")
    return 0


def _report(stack: DemoStack, samples: list[Any]) -> None:
    failed = [sample for sample in samples if sample.status != 200]
    print(f"\n{len(samples)} streamed requests through the gateway ({len(failed)} failed)\n")
    print("Traffic per tenant and pool (TTFT measured by the client; 'return' = the prefix came back after "
          "other traffic pushed it out of the GPU cache)")
    print(traffic_table(samples))
    print(f"\n{SPLIT_TENANT} (50 % rollout, sticky per user): TTFT p50 by phase and arm, measured by the client")
    print(phase_table(samples, SPLIT_TENANT))
    audit = _admin(stack, "/admin/audit")
    if audit is not None:
        print("\nOffloaded and GPU blocks per tenant (the block-lifecycle ledger, from vLLM KV events)")
        print(retention_table(audit))
    shadow = _admin(stack, "/admin/shadow")
    if shadow is not None:
        print("\nShadow A/B: each mirrored pair, ΔTTFT = TTFT(primary) − TTFT(shadow on control); "
              "pairs exist only for requests whose primary was the offload pool")
        print(shadow_table(shadow))


def _admin(stack: DemoStack, path: str) -> dict[str, Any] | None:
    reply = httpx.get(f"{stack.gateway.url}{path}", headers={"Authorization": f"Bearer {stack.admin_key}"},
                      timeout=30)
    if reply.status_code != 200:
        return None
    body: dict[str, Any] = reply.json()
    return body
