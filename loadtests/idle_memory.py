"""Idle memory of a served gateway: RSS, USS and PSS after start, and what its imports cost.

The gateway starts as `loadtests/proxy_overhead.py` starts it (`kvgate serve`, one tenant, info logging, every
feature on, a fast upstream behind it; the same helpers), then, after a settle, this reads its memory from
/proc: VmRSS (what proxy_overhead reports as idle RSS), and from /proc/<pid>/smaps_rollup the unique (USS:
private pages) and proportional (PSS) set sizes. With `--importtime` a second gateway is started with
PYTHONPROFILEIMPORTTIME=1 and its import log summarised: the slowest top-level packages (cumulative µs) and
which of them are loaded at all. `--attribute` imports the served gateway's top-level packages one by one, in
the order it imported them, in a fresh interpreter and reads its RSS after each: what each package adds on top
of those before it (an order-dependent split; shared dependencies land on the first importer), then the
gateway's own modules, and reports the rest of the served RSS as start-up's own.

    .venv/bin/python -m loadtests.idle_memory --out /tmp/idle-memory.json [--runs 3] [--importtime] [--attribute]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests import procstat
from loadtests.overhead_report import IDLE_RSS_TARGET_MIB
from loadtests.proxy_overhead import Config, start_gateway, start_upstream
from loadtests.proxy_overhead import parse_args as overhead_args
from loadtests.results import write_json

MIB = 1024 * 1024
SETTLE_S = 1.0  # as proxy_overhead: let start-up allocations settle before reading idle memory
TARGET_MIB = IDLE_RSS_TARGET_MIB
GATEWAY_ENTRY = ("gateway.cli.main", "gateway.cli.serve")  # what `kvgate serve` imports of the gateway's own
IMPORTTIME_PREFIX = "import time:"
# Packages whose import the issue names as heavy; reported as loaded or not in the served gateway.
WATCHED = ("aiohttp", "redis", "httpx", "pydantic", "prometheus_client", "zmq", "yaml", "msgspec", "structlog",
           "uvicorn", "uvloop", "httptools", "starlette", "sqlite3", "multidict", "yarl", "anyio", "h11",
           "websockets", "watchfiles", "dotenv", "email", "ssl", "http.cookies", "concurrent.futures")


@dataclass(frozen=True)
class Memory:
    rss_mib: float
    uss_mib: float
    pss_mib: float
    threads: int


@dataclass(frozen=True)
class ImportCost:
    package: str
    cumulative_ms: float
    self_ms: float


def read_memory(pid: int) -> Memory:
    """VmRSS, and USS (private clean + dirty) and PSS from smaps_rollup, of one process."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        fields[name.strip()] = int(rest.split()[0]) * 1024
    threads = len(os.listdir(f"/proc/{pid}/task"))
    uss = fields["Private_Clean"] + fields["Private_Dirty"]
    return Memory(procstat.rss_bytes(pid) / MIB, uss / MIB, fields["Pss"] / MIB, threads)


def overhead_config(work: Path, log_level: str) -> Config:
    """proxy_overhead's defaults (shadow pool configured, sample 0), so both start the same gateway."""
    return overhead_args(["--out", str(work / "unused.json"), "--log-level", log_level])


def served_memory(config: Config, work: Path, extra_env: dict[str, str] | None = None) -> tuple[Memory, str]:
    """Start the upstream and one gateway, wait for it to settle, read its memory; returns it and the log."""
    saved = {name: os.environ.get(name) for name in extra_env or {}}
    with ExitStack() as stack:
        upstream = stack.enter_context(start_upstream(config, work))
        os.environ.update(extra_env or {})
        try:
            gateway_cm, _key = start_gateway(config, work, upstream.url)
            gateway = stack.enter_context(gateway_cm)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        time.sleep(SETTLE_S)  # as proxy_overhead does before its idle reading
        return read_memory(gateway.popen.pid), gateway.log_text()


def import_costs(log: str) -> tuple[list[ImportCost], list[str]]:
    """Top-level packages by the import time spent in them (their modules, and what those imported, unless an
    enclosing module of the same package already counts it), and every module imported, from an importtime log.
    The log lists a module when its import finished, indented two spaces per level below its importer."""
    entries: list[tuple[int, str, int, int]] = []  # depth, module, self µs, cumulative µs
    for line in log.splitlines():
        if not line.startswith(IMPORTTIME_PREFIX) or "imported package" in line:
            continue
        own, cumulative, raw_name = line[len(IMPORTTIME_PREFIX):].split("|")
        name = raw_name[1:]  # one space follows the bar; the rest is the indentation
        depth = (len(name) - len(name.lstrip(" "))) // 2
        entries.append((depth, name.strip(), int(own), int(cumulative)))
    costs: dict[str, ImportCost] = {}
    ancestors: list[str] = []  # walking backwards, an importer is met before the modules it imported
    for depth, module, self_us, cumulative_us in reversed(entries):
        top = module.split(".")[0]
        del ancestors[depth:]
        outermost = top not in ancestors
        ancestors.append(top)
        previous = costs.get(top, ImportCost(top, 0.0, 0.0))
        costs[top] = ImportCost(top, previous.cumulative_ms + (cumulative_us / 1000 if outermost else 0.0),
                                previous.self_ms + self_us / 1000)
    ranked = sorted(costs.values(), key=lambda cost: cost.cumulative_ms, reverse=True)
    return ranked, [module for _, module, _, _ in entries]


def import_total_ms(log: str) -> float:
    """All import time: the modules imported at the top level of the import tree, with what they imported."""
    total_us = 0
    for line in log.splitlines():
        if line.startswith(IMPORTTIME_PREFIX) and "imported package" not in line:
            _own, cumulative, raw_name = line[len(IMPORTTIME_PREFIX):].split("|")
            if not raw_name[1:].startswith(" "):
                total_us += int(cumulative)
    return total_us / 1000


def attribute(order: list[str]) -> list[dict[str, Any]]:
    """RSS after importing each package in turn, in one fresh interpreter (the gateway's import order)."""
    script = (
        "import importlib, json, sys\n"
        "def rss():\n"
        "    for line in open('/proc/self/status'):\n"
        "        if line.startswith('VmRSS:'):\n"
        "            return int(line.split()[1]) / 1024\n"
        "rows = [['(interpreter)', rss()]]\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except Exception:\n"
        "        continue\n"
        "    rows.append([name, rss()])\n"
        "print(json.dumps(rows))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, json.dumps(order)], capture_output=True, text=True,
                          check=True, timeout=120)
    rows: list[list[Any]] = json.loads(done.stdout)
    return [{"package": name, "rss_mib": round(rss, 2), "added_mib": round(rss - (rows[i - 1][1] if i else 0), 2)}
            for i, (name, rss) in enumerate(rows)]


def first_seen_order(modules: list[str]) -> list[str]:
    """Top-level packages in the order the gateway first imported something of theirs (import-time log lists a
    module when its import finished, so a package is listed by its first finished module)."""
    order: list[str] = []
    for name in modules:
        top = name.split(".")[0]
        if top not in order:
            order.append(top)
    return order


def run(args: argparse.Namespace) -> dict[str, Any]:
    readings: list[Memory] = []
    result: dict[str, Any] = {}
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="kvgate-idle-") as tmp:
            memory, _log = served_memory(overhead_config(Path(tmp), args.log_level), Path(tmp))
            readings.append(memory)
            print(f"  rss {memory.rss_mib:.1f} MiB  uss {memory.uss_mib:.1f}  pss {memory.pss_mib:.1f}  "
                  f"threads {memory.threads}", file=sys.stderr, flush=True)
    result["runs"] = [asdict(memory) for memory in readings]
    result["median"] = {field: statistics.median(getattr(m, field) for m in readings)
                        for field in ("rss_mib", "uss_mib", "pss_mib", "threads")}
    result["target_rss_mib"] = TARGET_MIB
    result["meets_target"] = result["median"]["rss_mib"] <= TARGET_MIB
    if args.importtime or args.attribute:
        with tempfile.TemporaryDirectory(prefix="kvgate-idle-") as tmp:
            _memory, log = served_memory(overhead_config(Path(tmp), args.log_level), Path(tmp),
                                         {"PYTHONPROFILEIMPORTTIME": "1"})
        costs, modules = import_costs(log)
        loaded = {name.split(".")[0] for name in modules} | set(modules)
        result["modules_imported"] = len(modules)
        result["import_total_ms"] = round(import_total_ms(log), 1)
        result["slowest_imports"] = [asdict(cost) for cost in costs[: args.top]]
        result["watched_loaded"] = {name: name in loaded for name in WATCHED}
        if args.attribute:
            packages = [name for name in first_seen_order(modules) if name != "gateway"]
            result["attribution"] = attribute([*packages, *GATEWAY_ENTRY])  # the gateway's own modules last
            imported = result["attribution"][-1]["rss_mib"]
            result["after_start_mib"] = round(result["median"]["rss_mib"] - imported, 2)
    return result


def print_report(result: dict[str, Any]) -> None:
    median = result["median"]
    print(f"idle gateway: RSS {median['rss_mib']:.1f} MiB, USS {median['uss_mib']:.1f} MiB, "
          f"PSS {median['pss_mib']:.1f} MiB, {median['threads']:.0f} threads (median of {len(result['runs'])}); "
          f"target RSS <= {TARGET_MIB:.0f} MiB: {'met' if result['meets_target'] else 'NOT met'}")
    if "slowest_imports" in result:
        print(f"{result['modules_imported']} modules imported in {result['import_total_ms']:.0f} ms; slowest top-level "
              "packages (ms, with what they imported):")
        for cost in result["slowest_imports"]:
            print(f"  {cost['package']:<22} {cost['cumulative_ms']:8.1f}")
        print("loaded: " + ", ".join(name for name, yes in result["watched_loaded"].items() if yes))
        print("not loaded: " + ", ".join(name for name, yes in result["watched_loaded"].items() if not yes))
    if "attribution" in result:
        print("RSS added by each top-level package, imported in the gateway's order (>= 0.3 MiB shown):")
        for row in result["attribution"]:
            if row["added_mib"] >= 0.3:
                print(f"  +{row['added_mib']:5.1f} MiB  {row['package']}  (RSS {row['rss_mib']:.1f})")
        print(f"  +{result['after_start_mib']:5.1f} MiB  start-up itself (threads, SQLite, policies, metrics, "
              "uvicorn's server), the served median less all imports")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.idle_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON result file")
    parser.add_argument("--runs", type=int, default=3, help="gateways started and read one after another")
    parser.add_argument("--log-level", default="info", help="the gateway's KVGATE_LOG_LEVEL")
    parser.add_argument("--importtime", action="store_true", help="also summarise a served gateway's imports")
    parser.add_argument("--attribute", action="store_true", help="also split RSS by top-level package")
    parser.add_argument("--top", type=int, default=25, help="slowest imports listed")
    args = parser.parse_args(argv)
    result = run(args)
    result["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    print_report(result)
    write_json(result, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
