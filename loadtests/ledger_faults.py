"""Ledger fault matrix (issue 12): a `kvgate sim` with the CPU tier publishes KV events, a `kvgate serve`
process keeps the ledger (SQLite or Redis), and faults are injected into the real processes. The simulator's
own record of what it sent (`GET /sim/kv-truth`, per cache salt and medium) is the truth; the ledger is read
with `kvgate audit --format json` from the store. For each scenario and each (tenant, medium): stored /
removed / resident (+ unknown) against the truth, and whether any difference is reported as a gap, as
unknown blocks or as a restart. Not a test; prints a Markdown table and writes JSON.

    .venv/bin/python -m loadtests.ledger_faults --out loadtests/reports/ledger-faults-2026-12-01/faults.json

Traffic goes straight to the simulator with the salt the gateway would add (HMAC of the tenant and epoch),
so no API keys are involved; the gateway process only runs the ledger. Timers are shortened through
`KVGATE_LEDGER_*` (silent after 3 s, probes every 0.5 s) so a pause of 10 s stands for the issue's 60 s.
The issue's full size (a 60 s pause against the default 30 s threshold, a burst of a million block events):

    .venv/bin/python -m loadtests.ledger_faults --only publisher-paused burst --pause-s 60 --lost-after-s 30 \
        --burst-events 1000000 [--backend redis]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import signal
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import redis

from gateway.devtools.localproc import ServerProcess, free_port, free_port_pair, kvgate_command, run_server
from gateway.salts import derive_salt

TENANTS = ("acme", "globex")
EPOCH = 1
MEDIA = ("GPU", "CPU")
SETTLE_TIMEOUT_S = 60.0
QUIET_POLLS = 10
CPU_CHUNKS = 200  # a CPU tier small enough to evict (64-token chunks of the default model shape)


@dataclass(frozen=True)
class Knobs:
    """Sizes of a run. The issue's full size: `--pause-s 60 --lost-after-s 30 --burst-events 1000000`."""

    requests: int = 60  # per traffic phase
    pause_s: float = 10.0  # how long the publisher is SIGSTOPped
    lost_after_s: float = 3.0  # the ledger's silence threshold (KVGATE_LEDGER_LOST_AFTER_S)
    burst_events: int = 0  # block events (stored + removed) published while the gateway is stopped; 0: 50 phases
    backend: str = "sqlite"  # where the scenarios that are not about one store keep the ledger


@dataclass
class Stack:
    workdir: Path
    secret: str
    sim_port: int
    events_port: int
    redis_port: int | None = None
    lost_after_s: float = 3.0
    sims: list[ServerProcess] = field(default_factory=list)
    truths: list[dict[str, Any]] = field(default_factory=list)  # of simulator processes that ended
    exits: ExitStack = field(default_factory=ExitStack)

    @property
    def env(self) -> dict[str, str]:
        env = {"KVGATE_SALT_SECRET": self.secret, "KVGATE_POLICIES": str(self.workdir / "policies"),
               "KVGATE_LOG_FORMAT": "json", "KVGATE_LEDGER_LOST_AFTER_S": str(self.lost_after_s),
               "KVGATE_LEDGER_PROBE_INTERVAL_S": "0.5", "KVGATE_LEDGER_REPLAY_TIMEOUT_S": "0.5",
               "KVGATE_LEDGER_SQLITE_BUSY_TIMEOUT_MS": "1000"}
        if self.redis_port is not None:
            return env | {"KVGATE_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0"}
        return env | {"KVGATE_STATE_PATH": str(self.workdir / "ledger.sqlite3")}


def write_policies(stack: Stack) -> None:
    root = stack.workdir / "policies"
    (root / "tenants").mkdir(parents=True, exist_ok=True)
    (root / "gateway.yaml").write_text(
        f"pools:\n  offload:\n    upstreams: [\"http://127.0.0.1:{stack.sim_port}\"]\n"
        f"    kv_events: [\"tcp://127.0.0.1:{stack.events_port}\"]\n"
        "default_pool: offload\npublic_paths: [\"/livez\", \"/metrics\"]\n")
    for tenant in TENANTS:
        (root / "tenants" / f"{tenant}.yaml").write_text(
            f"tenant: {tenant}\nkeys:\n  - sha256: \"{hashlib.sha256(secrets.token_bytes(32)).hexdigest()}\"\n"
            "    scopes: [inference]\n"
            f"cache:\n  isolation: tenant\n  salt_epoch: {EPOCH}\noffload:\n  retention_seconds: 3600\n")


def start_sim(stack: Stack, *extra: str) -> ServerProcess:
    argv = kvgate_command("sim", "--port", str(stack.sim_port), "--offload", "--gpu-blocks", "128",
                          "--cpu-bytes-to-use", str(CPU_CHUNKS * 64 * 147456),
                          "--base-ttft-ms", "1", "--prefill-us-per-token", "1", "--decode-ms-per-token", "0",
                          "--kv-events-endpoint", f"tcp://*:{stack.events_port}",
                          "--kv-events-replay-endpoint", f"tcp://*:{stack.events_port + 1}", *extra)
    sim = stack.exits.enter_context(run_server(argv, stack.sim_port, stack.workdir / f"sim{len(stack.sims)}.log",
                                               ready_path="/health"))
    stack.sims.append(sim)
    return sim


@contextmanager
def gateway(stack: Stack, name: str) -> Iterator[ServerProcess]:
    port = free_port()
    argv = kvgate_command("serve", "--policies", str(stack.workdir / "policies"), "--port", str(port))
    with run_server(argv, port, stack.workdir / f"gateway-{name}.log", env=stack.env, ready_path="/livez") as gw:
        yield gw


@contextmanager
def redis_server(stack: Stack, name: str = "redis") -> Iterator[subprocess.Popen[bytes]]:
    assert stack.redis_port is not None
    argv = ["redis-server", "--port", str(stack.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "yes", "--appendfsync", "always", "--dir", str(stack.workdir)]
    with (stack.workdir / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    client = redis.Redis(port=stack.redis_port)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # polling while redis-server binds
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=10)


def traffic(stack: Stack, requests: int, seed: int, length: int = 1) -> None:
    """Prompts sharing per-tenant prefixes, so blocks are stored, reused, evicted and offloaded; `length`
    multiplies the prompts' length (longer prompts: more block events per request)."""
    rng = random.Random(seed)
    with httpx.Client(base_url=f"http://127.0.0.1:{stack.sim_port}", timeout=30) as client:
        for index in range(requests):
            tenant = TENANTS[index % len(TENANTS)]
            words = " ".join(f"{tenant}-doc{rng.randrange(6)}-w{i}"
                             for i in range(length * (40 + rng.randrange(60))))
            body = {"model": "sim-model", "prompt": words, "max_tokens": 2,
                    "cache_salt": derive_salt(stack.secret.encode(), tenant, EPOCH)}
            client.post("/v1/completions", json=body).raise_for_status()


def truth(stack: Stack) -> dict[str, Any]:
    return httpx.get(f"http://127.0.0.1:{stack.sim_port}/sim/kv-truth", timeout=10).json()  # type: ignore[no-any-return]


def block_events(view: dict[str, Any]) -> int:
    """Block events (stored + removed) a simulator process has published."""
    return sum(tally["stored"] + tally["removed"] for media in view["by_salt"].values() for tally in media.values())


def ledger(stack: Stack) -> dict[str, Any]:
    done = subprocess.run(kvgate_command("audit", "--format", "json"), capture_output=True, text=True,
                          env={**os.environ, **stack.env}, timeout=120, check=False)
    if done.returncode != 0:
        return {"error": done.stderr[-500:]}
    return json.loads(done.stdout)  # type: ignore[no-any-return]


Counts = dict[tuple[str, str], dict[str, int]]


def truth_counts(stack: Stack, truths: list[dict[str, Any]]) -> Counts:
    """Per (tenant, medium), summed over simulator processes; an earlier process's resident blocks are closed
    by its restart, so they count as removed."""
    salts = {derive_salt(stack.secret.encode(), tenant, EPOCH): tenant for tenant in TENANTS}
    counts: Counts = {}
    for position, view in enumerate(truths):
        last = position == len(truths) - 1
        for salt, media in view["by_salt"].items():
            for medium, tally in media.items():
                row = counts.setdefault((salts.get(salt, "unattributed"), medium),
                                        {"stored": 0, "removed": 0, "resident": 0})
                row["stored"] += tally["stored"]
                row["removed"] += tally["removed"] + (0 if last else tally["resident"])
                row["resident"] += tally["resident"] if last else 0
    return counts


def ledger_counts(report: dict[str, Any]) -> Counts:
    counts: Counts = {}
    for tenant, media in report.get("tenants", {}).items():
        for medium, view in media.items():
            if view["stored"] or view["resident"] or view["unknown"]:
                counts[(tenant, medium)] = {key: view[key] for key in ("stored", "removed", "resident", "unknown")}
    return counts


def settle(stack: Stack, expected: Callable[[], Counts]) -> tuple[Counts, dict[str, Any]]:
    """Poll the ledger until it equals the truth, or has not changed for `QUIET_POLLS` polls in a row (it
    flushes every 0.2 s, so it has taken in all it will), or the deadline passes."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    report: dict[str, Any] = {}
    previous, unchanged = None, 0
    while time.monotonic() < deadline:
        report = ledger(stack)
        counts = ledger_counts(report)
        if _matches(expected(), counts):
            break
        unchanged = unchanged + 1 if counts == previous else 0
        if unchanged >= QUIET_POLLS:
            break
        previous = counts
        time.sleep(0.5)  # polling the store, not synchronisation
    return expected(), report


def _matches(want: Counts, got: Counts) -> bool:
    keys = set(want) | set(got)
    return all({k: v for k, v in got.get(key, {}).items() if k != "unknown"} | {"unknown": 0}
               == want.get(key, {}) | {"unknown": got.get(key, {}).get("unknown", 0)} and
               got.get(key, {}).get("unknown", 0) == 0 for key in keys)


@dataclass
class Outcome:
    scenario: str
    rows: list[dict[str, Any]]
    gaps: list[dict[str, Any]]
    notes: list[str]

    @property
    def verdict(self) -> str:
        if all(row["equal"] for row in self.rows):
            return "equal"
        missing = sum(gap["missing_batches"] for gap in self.gaps)
        unknown = sum(row["ledger"].get("unknown", 0) for row in self.rows)
        if missing or unknown:
            return f"differs, reported ({missing} missing batches, {unknown} unknown)"
        return "DIFFERS, NOT REPORTED"


def store_errors(gw: ServerProcess) -> str:
    """The gateway's own count of failed store writes, by kind (evidence the fault reached the writer)."""
    text = httpx.get(f"{gw.url}/metrics", timeout=10).text
    found = [line for line in text.splitlines() if line.startswith(("kvgate_ledger_store_errors_total{",
                                                                    "kvgate_ledger_task_restarts_total{"))]
    return "store errors: " + (", ".join(found) if found else "none")


def outcome(name: str, want: Counts, report: dict[str, Any], notes: list[str]) -> Outcome:
    got = ledger_counts(report)
    closed: dict[str, int] = {}
    for media in report.get("tenants", {}).values():
        for view in media.values():
            for reason, count in view["closed_by"].items():
                closed[reason] = closed.get(reason, 0) + count
    notes = [*notes, f"closed_by {dict(sorted(closed.items()))}"]
    rows = []
    for key in sorted(set(want) | set(got)):
        truth_row = want.get(key, {"stored": 0, "removed": 0, "resident": 0})
        ledger_row = got.get(key, {"stored": 0, "removed": 0, "resident": 0, "unknown": 0})
        rows.append({"tenant": key[0], "medium": key[1], "truth": truth_row, "ledger": ledger_row,
                     "equal": _matches({key: truth_row}, {key: ledger_row})})
    return Outcome(name, rows, report.get("gaps", []), notes + ([report["error"]] if "error" in report else []))


# -- scenarios -------------------------------------------------------------------------------------


def new_stack(workdir: Path, name: str, knobs: Knobs, with_redis: bool | None = None) -> Stack:
    """`with_redis` None: the run's `--backend` (a Redis of the stack's own, started here)."""
    redis_backed = knobs.backend == "redis" if with_redis is None else with_redis
    suffix = "-redis" if redis_backed and with_redis is None else ""
    stack = Stack(workdir / (name + suffix), secrets.token_hex(32), free_port(), free_port_pair(),
                  free_port() if redis_backed else None, knobs.lost_after_s)
    stack.workdir.mkdir(parents=True, exist_ok=True)
    write_policies(stack)
    if redis_backed and with_redis is None:
        stack.exits.enter_context(redis_server(stack))
    return stack


def scenario_baseline(workdir: Path, knobs: Knobs) -> Outcome:
    stack = new_stack(workdir, "baseline", knobs)
    with stack.exits:
        start_sim(stack)
        with gateway(stack, "1"):
            traffic(stack, knobs.requests, 1)
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
    return outcome("no fault", want, report, [])


def scenario_publisher_restart(workdir: Path, knobs: Knobs) -> Outcome:
    stack = new_stack(workdir, "publisher-restart", knobs)
    with stack.exits:
        sim = start_sim(stack)
        with gateway(stack, "1"):
            traffic(stack, knobs.requests, 1)
            settle(stack, lambda: truth_counts(stack, [truth(stack)]))
        stack.truths.append(truth(stack))
        sim.send_signal(signal.SIGKILL)
        sim.popen.wait(timeout=10)
        start_sim(stack)
        traffic(stack, knobs.requests * 2, 2)  # the new process goes past the stored cursor while no gateway listens
        with gateway(stack, "2"):
            want, report = settle(stack, lambda: truth_counts(stack, [*stack.truths, truth(stack)]))
    return outcome("publisher restarted while the gateway was down (new process ahead)", want, report, [])


def scenario_publisher_paused(workdir: Path, knobs: Knobs) -> Outcome:
    stack = new_stack(workdir, "publisher-paused", knobs)
    notes = []
    with stack.exits:
        sim = start_sim(stack)
        with gateway(stack, "1"):
            traffic(stack, knobs.requests, 1)
            held = settle(stack, lambda: truth_counts(stack, [truth(stack)]))[0]
            sim.send_signal(signal.SIGSTOP)
            try:
                deadline = time.monotonic() + knobs.pause_s
                paused = ledger(stack)
                while time.monotonic() < deadline:
                    paused = ledger(stack)  # the last reading before SIGCONT is the one reported
                    time.sleep(min(5.0, knobs.pause_s / 20))  # the pause's length; silent after lost_after_s
            finally:
                sim.send_signal(signal.SIGCONT)
            unknown = sum(row.get("unknown", 0) for row in ledger_counts(paused).values())
            resident_truth = sum(row["resident"] for row in held.values())
            notes.append(f"during the pause: {unknown} blocks unknown, truth holds {resident_truth}; "
                         f"resident shown {sum(r['resident'] for r in ledger_counts(paused).values())}")
            traffic(stack, knobs.requests, 2)
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
    return outcome(f"publisher SIGSTOPped {knobs.pause_s:g} s (silent after {knobs.lost_after_s:g} s), then resumed",
                   want, report, notes)


def scenario_gateway_killed(workdir: Path, knobs: Knobs) -> Outcome:
    stack = new_stack(workdir, "gateway-killed", knobs)
    with stack.exits:
        start_sim(stack)
        with gateway(stack, "1") as first:
            traffic(stack, knobs.requests, 1)
            first.send_signal(signal.SIGKILL)  # mid-stream: batches may be spooled, not yet written
            first.popen.wait(timeout=10)
        traffic(stack, knobs.requests, 2)
        with gateway(stack, "2"):
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
    return outcome("gateway SIGKILLed mid-stream, restarted", want, report, [])


def _redis_fault(workdir: Path, knobs: Knobs, name: str, title: str,
                 inject: Callable[[Stack, redis.Redis], Callable[[], None]]) -> Outcome:
    stack = new_stack(workdir, name, knobs, with_redis=True)
    with stack.exits:
        stack.exits.enter_context(redis_server(stack))
        assert stack.redis_port is not None
        admin = redis.Redis(port=stack.redis_port)
        start_sim(stack)
        with gateway(stack, "1") as gw:
            traffic(stack, knobs.requests, 1)
            settle(stack, lambda: truth_counts(stack, [truth(stack)]))
            heal = inject(stack, admin)
            traffic(stack, knobs.requests, 2)
            heal()
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
            errors = store_errors(gw)
        admin.close()
    return outcome(title, want, report, [errors])


def scenario_redis_killed(workdir: Path, knobs: Knobs) -> Outcome:
    def inject(stack: Stack, admin: redis.Redis) -> Callable[[], None]:
        os.kill(_redis_pid(admin), signal.SIGKILL)

        def heal() -> None:
            stack.exits.enter_context(redis_server(stack, "redis-restarted"))
        return heal
    return _redis_fault(workdir, knobs, "redis-killed", "Redis SIGKILLed, restarted (AOF)", inject)


def _redis_pid(admin: redis.Redis) -> int:
    info: dict[str, Any] = admin.info("server")  # type: ignore[assignment]
    return int(info["process_id"])


def scenario_redis_read_only(workdir: Path, knobs: Knobs) -> Outcome:
    def inject(stack: Stack, admin: redis.Redis) -> Callable[[], None]:
        admin.replicaof("127.0.0.1", free_port())
        def heal() -> None:
            admin.replicaof("NO", "ONE")
        return heal
    return _redis_fault(workdir, knobs, "redis-read-only", "Redis read-only (REPLICAOF), then primary", inject)


def scenario_redis_oom(workdir: Path, knobs: Knobs) -> Outcome:
    def inject(stack: Stack, admin: redis.Redis) -> Callable[[], None]:
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        def heal() -> None:
            admin.config_set("maxmemory", "0")
        return heal
    return _redis_fault(workdir, knobs, "redis-oom", "Redis at maxmemory (OOM), then freed", inject)


def scenario_sqlite_locked(workdir: Path, knobs: Knobs) -> Outcome:
    stack = new_stack(workdir, "sqlite-locked", knobs, with_redis=False)
    with stack.exits:
        start_sim(stack)
        with gateway(stack, "1") as gw:
            traffic(stack, knobs.requests, 1)
            settle(stack, lambda: truth_counts(stack, [truth(stack)]))
            holder = sqlite3.connect(stack.workdir / "ledger.sqlite3", isolation_level=None)
            holder.execute("BEGIN IMMEDIATE")
            locked_until = time.monotonic() + 15
            traffic(stack, knobs.requests, 2)
            while time.monotonic() < locked_until:
                time.sleep(0.5)  # holding the lock for 15 s
            holder.execute("ROLLBACK")
            holder.close()
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
            errors = store_errors(gw)
    return outcome("SQLite locked by another process for 15 s", want, report, [errors])


def scenario_burst(workdir: Path, knobs: Knobs) -> Outcome:
    """The gateway stops reading (SIGSTOP) while the simulator publishes far past its PUB high-water mark
    (50 messages) and past its replay buffer (300 batches): replay recovers what it still holds, the rest
    must show as missing batches."""
    stack = new_stack(workdir, "burst", knobs)
    with stack.exits:
        start_sim(stack, "--kv-events-hwm", "50", "--kv-events-buffer-steps", "300")
        with gateway(stack, "1") as gw:
            traffic(stack, knobs.requests, 1)
            settle(stack, lambda: truth_counts(stack, [truth(stack)]))
            start = truth(stack)
            gw.send_signal(signal.SIGSTOP)
            started = time.monotonic()
            try:
                if knobs.burst_events:  # prompts twice as long (~2x the events per request) until the target
                    round_ = 0
                    while block_events(truth(stack)) - block_events(start) < knobs.burst_events:
                        round_ += 1
                        traffic(stack, 200, 100 + round_, length=2)
                else:
                    traffic(stack, knobs.requests * 50, 2)
            finally:
                gw.send_signal(signal.SIGCONT)
            end = truth(stack)
            burst, events = end["batches_sent"] - start["batches_sent"], block_events(end) - block_events(start)
            took = time.monotonic() - started
            traffic(stack, 4, 3)
            want, report = settle(stack, lambda: truth_counts(stack, [truth(stack)]))
    return outcome(f"burst of {events:,} block events past the PUB high-water mark and the replay buffer while the "
                   "gateway is stopped", want, report,
                   [f"{burst} batches ({events:,} block events) published in {took:.0f} s during the burst "
                    "(hwm 50, replay buffer 300)"])


SCENARIOS: dict[str, Callable[[Path, Knobs], Outcome]] = {
    "baseline": scenario_baseline,
    "publisher-restart": scenario_publisher_restart,
    "publisher-paused": scenario_publisher_paused,
    "gateway-killed": scenario_gateway_killed,
    "redis-killed": scenario_redis_killed,
    "redis-read-only": scenario_redis_read_only,
    "redis-oom": scenario_redis_oom,
    "sqlite-locked": scenario_sqlite_locked,
    "burst": scenario_burst,
}


def table(outcomes: list[Outcome]) -> str:
    lines = ["| scenario | tenant | medium | truth stored/removed/resident | ledger stored/removed/resident/unknown "
             "| equal |", "| --- | --- | --- | --- | --- | --- |"]
    for result in outcomes:
        for row in result.rows:
            truth_row, ledger_row = row["truth"], row["ledger"]
            lines.append(f"| {result.scenario} | {row['tenant']} | {row['medium']} | {truth_row['stored']}/"
                         f"{truth_row['removed']}/{truth_row['resident']} | {ledger_row['stored']}/"
                         f"{ledger_row['removed']}/{ledger_row['resident']}/{ledger_row.get('unknown', 0)} | "
                         f"{'yes' if row['equal'] else 'no'} |")
    lines += ["", "| scenario | verdict | gaps (missing batches, restarts, silences) | notes |",
              "| --- | --- | --- | --- |"]
    for result in outcomes:
        gaps = "; ".join(f"{g['source']}: {g['missing_batches']}, {g['restarts']}, {g['lost']}" for g in result.gaps)
        lines.append(f"| {result.scenario} | {result.verdict} | {gaps} | {' '.join(result.notes)} |")
    return "\n".join(lines) + "\n"


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(f"stopped by signal {signum}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=60, help="requests per traffic phase")
    parser.add_argument("--pause-s", type=float, default=10.0, help="how long the publisher is paused")
    parser.add_argument("--lost-after-s", type=float, default=3.0, help="the ledger's silence threshold")
    parser.add_argument("--burst-events", type=int, default=0,
                        help="block events published during the burst (0: 50 traffic phases)")
    parser.add_argument("--backend", choices=("sqlite", "redis"), default="sqlite",
                        help="the store of the scenarios not about one store")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/kvgate-ledger-faults"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, _stop)  # so every process it started is stopped on the way out
    knobs = Knobs(args.requests, args.pause_s, args.lost_after_s, args.burst_events, args.backend)
    outcomes = []
    for name in args.only or list(SCENARIOS):
        started = time.monotonic()
        result = SCENARIOS[name](args.workdir, knobs)
        print(f"{name}: {result.verdict} ({time.monotonic() - started:.0f} s)", flush=True)
        outcomes.append(result)
        if args.out is not None:  # after every scenario, so a run cut short keeps what it measured
            args.out.write_text(json.dumps([{"scenario": o.scenario, "verdict": o.verdict, "rows": o.rows,
                                              "gaps": o.gaps, "notes": o.notes} for o in outcomes], indent=2) + "\n")
    print(table(outcomes))


if __name__ == "__main__":
    main()
