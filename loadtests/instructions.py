"""Instructions per streamed request, counted by valgrind's callgrind: a deterministic measure of proxy cost.

CPU time per request on a shared machine moves by 5 % between two runs of the same code (the A/A pair in
`loadtests/reports/perf-2026-12-02/`), so a cut worth 2 % cannot be told from noise there. Instructions
retired by the proxy process do not depend on what else runs on the machine. This benchmark runs each proxy
under `valgrind --tool=callgrind`, sends `--requests` streaming requests (after a warm-up) from a client that
runs natively, and reads the instructions the proxy retired in that span, all its threads included, from a
callgrind dump taken over exactly that span (`callgrind_control --zero` before, `--dump` after).

What it measures is not time: a syscall counts only its user-side instructions, and cache misses and branch
mispredictions are not seen. The proxy runs ~20× slower under valgrind, so the upstream spaces its tokens 3 ms
apart: each event still arrives in its own socket read, as at moderate load natively (at 1 ms, reads coalesced
events by amounts that varied from run to run). It answers "does this change make the proxy execute less?" to
about 1 %. Time on a quiet machine (`loadtests/proxy_overhead.py` on the device host) stays the measure of
record for the issue's targets.

Targets, all in front of the same fast upstream (`loadtests/fast_upstream.py`, natively):
- `gateway`: `kvgate serve` with the benchmark tenant of `loadtests/proxy_overhead.py` (every feature on);
- `gateway-compared`: the same from `--compare-tree` and/or with `--compare-env` settings;
- `floor-asgi`, `floor-protocol`: the bare relays of `loadtests/floor_relay.py`.

With `--tokens 1 64` the difference between the two answer lengths splits a proxy's count into a fixed part per
request and a part per SSE event.

    python -m loadtests.instructions --tokens 1 64 --targets gateway floor-asgi --out F.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.devtools.localproc import ServerProcess, free_port, run_server
from loadtests import loadgen
from loadtests.loadgen import Target
from loadtests.overhead_report import GATEWAY
from loadtests.proxy_overhead import (
    COMPARED,
    COMPARED_POLICIES,
    FLOOR_KINDS,
    PROMPT,
    REPO_ROOT,
    env_setting,
    gateway_env,
    importable_from,
    importable_here,
    offload_section,
    write_policies,
)

TARGETS = (GATEWAY, COMPARED, *FLOOR_KINDS)
CALLGRIND_TIMEOUT_S = 60.0
TOKEN_MS = 3.0  # upstream spacing between tokens: each event its own socket read even under valgrind
TTFT_MS = 5.0
SHADOW_SAMPLE = 0.0  # proxy_overhead's default: the shadow feature is configured, no request mirrored


@dataclass(frozen=True)
class Config:
    targets: tuple[str, ...]
    tokens: tuple[int, ...]
    requests: int
    concurrency: int
    warmup: int
    rounds: int
    compare_tree: Path | None
    compare_env: tuple[tuple[str, str], ...]
    compare_offload: dict[str, Any] | None
    log_level: str
    out: Path | None


@dataclass(frozen=True)
class Count:
    target: str
    tokens: int
    round: int
    requests: int
    events_per_request: float
    instructions: int  # retired by the proxy process (all threads) while the measured requests ran

    @property
    def per_request(self) -> float:
        return self.instructions / self.requests


def parse_args(argv: Sequence[str] | None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--targets", nargs="+", choices=TARGETS, default=[GATEWAY, "floor-asgi"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 64], help="answer lengths to measure")
    parser.add_argument("--requests", type=int, default=200, help="measured requests per proxy and length")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=40, help="requests before the count starts")
    parser.add_argument("--rounds", type=int, default=1, help="fresh proxy processes per proxy and length")
    parser.add_argument("--compare-tree", type=Path, help="a source tree for the gateway-compared target")
    parser.add_argument("--compare-env", type=env_setting, action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the gateway-compared target (repeatable)")
    parser.add_argument("--compare-offload", type=offload_section, metavar="JSON",
                        help="the gateway-compared target's tenant has this `offload` section instead, e.g. '{}' "
                        "(no admission, no miss path): what the features left out cost")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--out", type=Path)
    args: Any = parser.parse_args(argv)
    if COMPARED in args.targets and args.compare_tree is None and not args.compare_env \
            and args.compare_offload is None:
        parser.error(f"{COMPARED} needs --compare-tree, --compare-env or --compare-offload")
    if min(args.tokens) < 1 or args.requests < 1 or args.concurrency < 1 or args.rounds < 1:
        parser.error("--tokens, --requests, --concurrency and --rounds must be at least 1")
    return Config(tuple(args.targets), tuple(args.tokens), args.requests, args.concurrency, args.warmup,
                  args.rounds, args.compare_tree, tuple(args.compare_env), args.compare_offload, args.log_level,
                  args.out)


def valgrind_missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    for tool in ("valgrind", "callgrind_control"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH (apt install valgrind)"
    return None


# -- processes ------------------------------------------------------------------------------------------


def under_callgrind(argv: Sequence[str], out: Path) -> list[str]:
    # Instruction counts only: no cache or branch simulation, no per-instruction detail.
    return ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no", *argv]


def proxy_argv(config: Config, target: str, port: int, work: Path, upstream_url: str) -> list[str]:
    if target in FLOOR_KINDS:
        return [sys.executable, "-m", "loadtests.floor_relay", FLOOR_KINDS[target], "--port", str(port),
                "--upstream", upstream_url]
    # -P: a compared tree is imported from its PYTHONPATH entry, never from the working directory.
    return [sys.executable, "-P", "-m", "gateway", "serve", "--policies", str(policies_of(config, target, work)),
            "--port", str(port)]


def policies_of(config: Config, target: str, work: Path) -> Path:
    return work / (COMPARED_POLICIES if target == COMPARED and config.compare_offload is not None else "policies")


def proxy_env(config: Config, target: str, work: Path) -> dict[str, str]:
    if target in FLOOR_KINDS:
        return importable_here()
    policies = str(policies_of(config, target, work))
    settings = {**gateway_env(config.log_level, work, target), "KVGATE_POLICIES": policies}
    if target == COMPARED:
        return {**settings, **importable_from(config.compare_tree or REPO_ROOT), **dict(config.compare_env)}
    return {**settings, **importable_here()}


def start_upstream(work: Path) -> AbstractContextManager[ServerProcess]:
    """One upstream for the whole run: each request's `max_tokens` sets its answer's length."""
    port = free_port()
    argv = [sys.executable, "-m", "loadtests.fast_upstream", "--port", str(port), "--ttft-ms", str(TTFT_MS),
            "--token-ms", str(TOKEN_MS)]
    return run_server(argv, port, work / "upstream.log", env=importable_here(), ready_path="/health")


@contextmanager
def proxy_under_callgrind(config: Config, target: str, work: Path, upstream_url: str,
                          dump: Path) -> Iterator[ServerProcess]:
    port = free_port()
    argv = under_callgrind(proxy_argv(config, target, port, work, upstream_url), dump)
    ready = "/health" if target in FLOOR_KINDS else "/livez"
    with run_server(argv, port, work / f"{target}.log", env=proxy_env(config, target, work), ready_path=ready) as proc:
        yield proc


def callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True,
                   timeout=CALLGRIND_TIMEOUT_S)


def dumped_instructions(dump: Path) -> int:
    """The `summary:` line (instructions) of the dump that `callgrind_control --dump` wrote: `dump` with a
    `.N` suffix and the trigger `dump` (the file without a suffix is written at exit)."""
    for path in sorted(dump.parent.glob(f"{dump.name}.*")):
        text = path.read_text(errors="replace")
        if "\ndesc: Trigger: dump" not in text:
            continue
        for line in text.splitlines():
            if line.startswith("summary:"):
                return int(line.split()[1])
    raise RuntimeError(f"no callgrind dump with a summary next to {dump}")


# -- one count ------------------------------------------------------------------------------------------


def request_body(tokens: int) -> bytes:
    return json.dumps({"model": "m", "max_tokens": tokens, "stream": True, "temperature": 0,
                       "messages": [{"role": "user", "content": PROMPT}]}).encode()


async def send_requests(target: Target, count: int, concurrency: int) -> list[loadgen.Sample]:
    samples: list[loadgen.Sample] = []
    queue = iter(range(count))

    async def worker(session: Any) -> None:
        for _ in queue:
            samples.append(await loadgen.one_request(session, target))

    async with loadgen.new_session(concurrency) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return samples


def count_once(config: Config, target: str, tokens: int, round_: int, run_: Run) -> Count:
    dump = run_.work / f"callgrind.{target}.{tokens}.{round_}"
    with proxy_under_callgrind(config, target, run_.work, run_.upstream_url, dump) as proxy:
        headers = {"content-type": "application/json", "authorization": f"Bearer {run_.key}"}
        request = Target(target, f"{proxy.url}/v1/chat/completions", headers, request_body(tokens))
        warm = asyncio.run(send_requests(request, config.warmup, config.concurrency))
        if not all(sample.ok for sample in warm):
            raise RuntimeError(f"{target}: a warm-up request failed; see {proxy.log_path}")
        callgrind_control("--zero", proxy.popen.pid)
        samples = asyncio.run(send_requests(request, config.requests, config.concurrency))
        callgrind_control("--dump", proxy.popen.pid)
    if not all(sample.ok for sample in samples):
        raise RuntimeError(f"{target}: {sum(not s.ok for s in samples)} measured requests failed")
    events = sum(sample.events for sample in samples) / len(samples)
    return Count(target, tokens, round_, len(samples), events, dumped_instructions(dump))


@dataclass(frozen=True)
class Run:
    work: Path
    upstream_url: str
    key: str  # the benchmark tenant's key (the floors ignore it)


def run(config: Config, work: Path) -> list[Count]:
    counts: list[Count] = []
    with start_upstream(work) as upstream:
        key = write_policies(work / "policies", upstream.url, SHADOW_SAMPLE)
        if config.compare_offload is not None:
            write_policies(work / COMPARED_POLICIES, upstream.url, SHADOW_SAMPLE, config.compare_offload, key)
        run_ = Run(work, upstream.url, key)
        for round_ in range(config.rounds):
            for tokens in config.tokens:
                for target in config.targets:
                    counted = count_once(config, target, tokens, round_, run_)
                    print(f"{target:<18} {tokens:>4} tokens  round {round_ + 1}: "
                          f"{counted.per_request / 1e6:.3f} M instructions per request "
                          f"({counted.events_per_request:.1f} events)", file=sys.stderr, flush=True)
                    counts.append(counted)
    return counts


# -- the report -----------------------------------------------------------------------------------------


def summary(counts: Sequence[Count]) -> dict[str, Any]:
    """Instructions per request per proxy and length, the upper median of the rounds (with two rounds, the larger
    count); the fixed and per-event split where two lengths were measured; each proxy against floor-asgi where it
    ran."""
    table: dict[str, dict[int, float]] = {}
    events: dict[str, dict[int, float]] = {}
    for target in dict.fromkeys(c.target for c in counts):
        for tokens in dict.fromkeys(c.tokens for c in counts):
            mine = sorted(c.per_request for c in counts if c.target == target and c.tokens == tokens)
            if mine:
                table.setdefault(target, {})[tokens] = mine[len(mine) // 2]
                events.setdefault(target, {})[tokens] = next(
                    c.events_per_request for c in counts if c.target == target and c.tokens == tokens)
    split: dict[str, dict[str, float]] = {}
    for target, by_tokens in table.items():
        if len(by_tokens) >= 2:
            low, high = min(by_tokens), max(by_tokens)
            per_event = (by_tokens[high] - by_tokens[low]) / (events[target][high] - events[target][low])
            split[target] = {"per_event": per_event, "fixed": by_tokens[low] - per_event * events[target][low]}
    return {"per_request": {t: {str(k): v for k, v in row.items()} for t, row in table.items()},
            "events_per_request": {t: {str(k): v for k, v in row.items()} for t, row in events.items()},
            "split": split}


def print_table(result: dict[str, Any]) -> None:
    per_request, split = result["per_request"], result["split"]
    lengths = sorted({int(k) for row in per_request.values() for k in row})
    floor = per_request.get("floor-asgi", {})
    print("instructions per streamed request (millions; upper median of rounds)")
    print(f"{'proxy':<18}" + "".join(f"{f'{n} tok':>10}{'× floor':>9}" for n in lengths)
          + (f"{'fixed':>10}{'per event':>11}" if split else ""))
    for target, row in per_request.items():
        cells = ""
        for n in lengths:
            value = row.get(str(n))
            ratio = value / floor[str(n)] if value is not None and str(n) in floor else None
            cells += f"{value / 1e6:>10.3f}" if value is not None else f"{'-':>10}"
            cells += f"{ratio:>9.2f}" if ratio is not None else f"{'-':>9}"
        if target in split:
            cells += f"{split[target]['fixed'] / 1e6:>10.3f}{split[target]['per_event'] / 1e3:>9.1f} k"
        print(f"{target:<18}{cells}")
    print()


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    missing = valgrind_missing()
    if missing is not None:
        print(f"cannot count instructions: {missing}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvgate-instructions-") as scratch:
        counts = run(config, Path(scratch))
    result = {"config": {**asdict(config), "compare_tree": str(config.compare_tree) if config.compare_tree else None,
                         "out": None},
              "counts": [asdict(c) for c in counts], **summary(counts)}
    print_table(result)
    if config.out is not None:
        config.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
