"""`kvgate doctor`: what each upstream says about itself that matters for offloading and the miss path.

Per pool and upstream: the vLLM version (`GET /version`) and so whether `max_load_tokens` is honoured (the miss
path's recompute method), whether the server runs a CPU offload tier (the `vllm:kv_offload_*` families, the
`kv_offloading_*` labels of `vllm:cache_config_info`), and its `kv_load_failure_policy`.

Where `kv_load_failure_policy` can be read, in this order: a label of any `/metrics` sample (vLLM's Prometheus
logger exports the cache config only, as `vllm:cache_config_info`, and no family of the captured 0.25.0
`/metrics` carries the transfer config: tests/fixtures/vllm-0.25.0/metrics/); `GET /server_info?config_format=json`,
which vLLM serves only with VLLM_SERVER_DEV_MODE=1 and which dumps the engine config, transfer config included;
the server's start-up log, whose engine config line carries it (`--server-log POOL=PATH`). When none says, the
report says `unknown`, never a default.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.policy.loader import PolicyLoadError, PolicySet, load_policy_set
from gateway.policy.model import PoolConfig
from gateway.proxy.misspath import honours_max_load_tokens
from gateway.tables import table

TIMEOUT_S = 5.0
LOG_POLICY = re.compile(r"""kv_load_failure_policy['"]?\s*[=:]\s*['"]?(fail|recompute)""")
OFFLOAD_FAMILY_PREFIX = "vllm:kv_offload_"


@dataclass
class UpstreamReport:
    pool: str
    upstream: str
    reachable: bool
    version: str | None
    max_load_tokens: str  # honoured | ignored | unknown
    miss_path_recompute: str  # what the gateway will send: max_load_tokens | salt (and why)
    offload_tier: str  # yes (how seen) | no | unknown
    kv_load_failure_policy: str  # fail | recompute | unknown (where it was read)
    advice: list[str]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--policies", type=Path, default=Path(os.environ.get("KVGATE_POLICIES", "policies")),
                        help="policy directory (env KVGATE_POLICIES, default ./policies)")
    parser.add_argument("--server-log", action="append", default=[], metavar="POOL=PATH",
                        help="a vLLM server log of that pool, to read kv_load_failure_policy from (repeatable)")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    parser.set_defaults(command=run)


def run(args: argparse.Namespace) -> int:
    try:
        policies = load_policy_set(args.policies)
    except PolicyLoadError as error:
        for problem in error.problems:
            print(problem, file=sys.stderr)
        return 1
    logs = dict(entry.split("=", 1) for entry in args.server_log if "=" in entry)
    reports = diagnose(policies, {pool: Path(path) for pool, path in logs.items()})
    if args.format == "json":
        print(json.dumps([asdict(report) for report in reports], indent=1))
    else:
        print(render(reports, policies))
    return 0 if all(report.reachable for report in reports) else 1


def diagnose(policies: PolicySet, logs: dict[str, Path]) -> list[UpstreamReport]:
    reports = []
    with httpx.Client(timeout=TIMEOUT_S) as client:
        for name, pool in policies.gateway.pools.items():
            for upstream in pool.upstreams:
                reports.append(examine(client, name, pool, upstream, logs.get(name)))
    return reports


def examine(client: httpx.Client, name: str, pool: PoolConfig, upstream: str, log: Path | None) -> UpstreamReport:
    headers = _auth(pool)
    version = _version(client, upstream, headers)
    metrics = _get(client, f"{upstream}/metrics", headers)
    server_info = _get(client, f"{upstream}/server_info?config_format=json", headers)
    reachable = version is not None or metrics is not None
    honours = None if version is None else honours_max_load_tokens(version)
    report = UpstreamReport(
        pool=name, upstream=upstream, reachable=reachable, version=version,
        max_load_tokens="unknown" if honours is None else ("honoured" if honours else "ignored"),
        miss_path_recompute=_recompute(pool, honours), offload_tier=_offload_tier(metrics),
        kv_load_failure_policy=_failure_policy(metrics, log, server_info), advice=[])
    report.advice = _advice(report)
    return report


def _auth(pool: PoolConfig) -> dict[str, str]:
    key = os.environ.get(pool.api_key_env) if pool.api_key_env else None
    return {"authorization": f"Bearer {key}"} if key else {}


def _get(client: httpx.Client, url: str, headers: dict[str, str]) -> str | None:
    try:
        reply = client.get(url, headers=headers)
    except httpx.HTTPError:
        return None
    return reply.text if reply.status_code == 200 else None


def _version(client: httpx.Client, upstream: str, headers: dict[str, str]) -> str | None:
    body = _get(client, f"{upstream}/version", headers)
    try:
        parsed: Any = json.loads(body) if body else None
    except ValueError:
        return None
    version = parsed.get("version") if isinstance(parsed, dict) else None
    return version if isinstance(version, str) else None


def _recompute(pool: PoolConfig, honours: bool | None) -> str:
    if pool.recompute != "auto":
        return f"{pool.recompute} (pool setting)"
    if honours:
        return "max_load_tokens (auto: this version reads it)"
    return "salt (auto: " + ("version unknown)" if honours is None else "this version ignores max_load_tokens)")


def _offload_tier(metrics: str | None) -> str:
    if metrics is None:
        return "unknown"
    families = {family.name: family for family in text_string_to_metric_families(metrics)}
    if any(name.startswith(OFFLOAD_FAMILY_PREFIX) for name in families):
        return "yes (vllm:kv_offload_* families)"
    info = families.get("vllm:cache_config_info")
    labels = dict(info.samples[0].labels) if info is not None and info.samples else {}
    if labels.get("kv_offloading_size") not in (None, "None"):
        return f"yes (kv_offloading_size {labels['kv_offloading_size']} GiB)"
    return "no"


def _failure_policy(metrics: str | None, log: Path | None, server_info: str | None = None) -> str:
    if metrics is not None:
        for family in text_string_to_metric_families(metrics):
            for sample in family.samples:
                if "kv_load_failure_policy" in sample.labels:
                    return f"{sample.labels['kv_load_failure_policy']} (/metrics {family.name})"
    if server_info is not None:
        found = LOG_POLICY.search(server_info)
        if found:
            return f"{found.group(1)} (/server_info, dev mode)"
        if '"kv_transfer_config":null' in server_info.replace(" ", ""):
            return "none (/server_info: no KV connector)"
    if log is not None:
        try:
            match = LOG_POLICY.search(log.read_text(errors="replace"))
        except OSError as error:
            return f"unknown (cannot read {log}: {error.strerror})"
        if match:
            return f"{match.group(1)} (server log)"
        return "unknown (not in the server log)"
    return "unknown (not in /metrics; /server_info needs VLLM_SERVER_DEV_MODE=1; or pass --server-log)"


def _advice(report: UpstreamReport) -> list[str]:
    advice = []
    if not report.reachable:
        return ["unreachable: nothing could be checked"]
    if report.offload_tier.startswith("yes") and not report.kv_load_failure_policy.startswith("recompute"):
        advice.append('start vLLM with "kv_load_failure_policy": "recompute" at the top level of '
                      "--kv-transfer-config, and/or give its tenants offload.miss_path: retry")
    if report.max_load_tokens == "ignored":
        advice.append("max_load_tokens caps are not enforced by this server; the miss path uses a one-time salt")
    return advice


def render(reports: list[UpstreamReport], policies: PolicySet) -> str:
    rows = [(r.pool, r.upstream, r.version, r.max_load_tokens, r.miss_path_recompute, r.offload_tier,
             r.kv_load_failure_policy) for r in reports]
    header = ("pool", "upstream", "version", "max_load_tokens", "miss-path recompute", "offload tier",
              "kv_load_failure_policy")
    lines = [table(header, rows), ""]
    for report in reports:
        lines += [f"{report.pool} {report.upstream}: {line}" for line in report.advice]
    tenants = [(name, t.offload.admission.mode, t.offload.miss_path, t.rollout.else_pool)
               for name, t in sorted(policies.tenants.items())]
    lines += ["", table(("tenant", "admission", "miss_path", "else_pool"), tenants)]
    return "\n".join(lines)
