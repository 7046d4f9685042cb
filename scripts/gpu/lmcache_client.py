"""Client of the LMCache run on the H200 (scripts/gpu/lmcache_host.sh), through kvgate. Two subcommands:

  policies DIR --lm URL --control URL [--events ENDPOINT]   write the policy directory and DIR/keys.json
  run --gateway URL --keys FILE --lm URL --control URL --out DIR [--tokens N]

`run` shows, in order: (1) a returning 8000-token prefix served from LMCache against the control arm (TTFT,
cached tokens, and the LMCache server's external-hit counters around the return); (2) two tenants with one
prompt on the tagged pool `lm`; (3) the same on `lm-untagged` (same server, the pool claims no LMCache, so no
tag); (4) the isolation canary on both pools; (5) the ledger's audit. Results: OUT/results.json and results.md.
Prompts are random token ids (the dummy model's vocabulary is 32000), so lengths are exact.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.keys import hash_key, new_key

VOCAB = (100, 31000)
PRESSURE = 4  # four other 8000-token prompts push a prefix out of a 20,336-token GPU cache
HIT_FAMILIES = ("vllm:external_prefix_cache_hits_total", "vllm:prefix_cache_hits_total",
                "lmcache:num_hit_tokens_total", "lmcache:num_stored_tokens_total", "lmcache:local_cache_usage",
                "lmcache:local_cpu_evict_count_total")
TENANTS = {"acme": "lm", "beta": "lm", "acme-u": "lm-untagged", "beta-u": "lm-untagged", "ctl": "control"}


def write_policies(directory: Path, lm: str, control: str, events: str | None) -> None:
    pools: dict[str, Any] = {
        # settle_s: in the multi-process phase the LMCache server stores asynchronously
        "lm": {"upstreams": [lm], "connector": "lmcache", "kv_events": [events] if events else [],
               "canary": {"settle_s": 1.0}},
        "lm-untagged": {"upstreams": [lm], "connector": "offloading", "canary": {"settle_s": 1.0}},
        "control": {"upstreams": [control], "connector": "none"},
    }
    (directory / "tenants").mkdir(parents=True, exist_ok=True)
    gateway = {"pools": pools, "default_pool": "lm", "public_paths": ["/livez"]}
    (directory / "gateway.yaml").write_text(yaml.safe_dump(gateway))
    keys = {}
    for tenant, pool in {**TENANTS, "root": None}.items():
        keys[tenant] = new_key()
        scopes = ["admin", "metrics"] if pool is None else ["inference"]
        body: dict[str, Any] = {"tenant": tenant, "keys": [{"sha256": hash_key(keys[tenant]), "scopes": scopes}]}
        if pool is not None:
            body["rollout"] = {"pool": pool}
        (directory / "tenants" / f"{tenant}.yaml").write_text(yaml.safe_dump(body))
    (directory / "keys.json").write_text(json.dumps(keys))


def prompt(tokens: int, rng: random.Random) -> list[int]:
    return [rng.randrange(*VOCAB) for _ in range(tokens)]


def stream(client: httpx.Client, key: str, ids: list[int]) -> dict[str, Any]:
    """One streamed completion through the gateway: TTFT (first content event) and cached tokens."""
    body = {"model": "m", "prompt": ids, "max_tokens": 4, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    started, ttft, usage = time.perf_counter(), None, None
    with client.stream("POST", "/v1/completions", json=body, headers={"authorization": f"Bearer {key}"}) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if ttft is None and event.get("choices"):
                ttft = time.perf_counter() - started
            usage = event.get("usage") or usage
        status, pool = reply.status_code, reply.headers.get("x-kvgate-pool")
    cached = ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    return {"status": status, "pool": pool, "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
            "cached_tokens": cached, "prompt_tokens": (usage or {}).get("prompt_tokens")}


def counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in HIT_FAMILIES:
            found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {name: round(after[name] - before.get(name, 0.0), 1) for name in after}


def returning_prefix(client: httpx.Client, keys: dict[str, str], tenant: str, upstream: str, tokens: int,
                     rng: random.Random) -> dict[str, Any]:
    target = prompt(tokens, rng)
    cold = stream(client, keys[tenant], target)
    for _ in range(PRESSURE):
        stream(client, keys[tenant], prompt(tokens, rng))
    before = counters(upstream)
    back = stream(client, keys[tenant], target)
    after = counters(upstream)
    return {"tenant": tenant, "cold": cold, "return": back, "upstream_counters_delta": delta(before, after)}


def two_tenants(client: httpx.Client, keys: dict[str, str], first: str, second: str, upstream: str, tokens: int,
                rng: random.Random) -> dict[str, Any]:
    shared = prompt(tokens, rng)
    a = stream(client, keys[first], shared)
    before = counters(upstream)
    b = stream(client, keys[second], shared)
    return {"first": first, "second": second, "first_result": a, "second_result": b,
            "upstream_counters_delta_during_second": delta(before, counters(upstream))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    keys = json.loads(Path(args.keys).read_text())
    rng = random.Random(args.seed)
    admin = {"authorization": f"Bearer {keys['root']}"}
    results: dict[str, Any] = {"tokens": args.tokens}
    with httpx.Client(base_url=args.gateway, timeout=300) as client:
        results["returning_prefix"] = {
            "lmcache": returning_prefix(client, keys, "acme", args.lm, args.tokens, rng),
            "control": returning_prefix(client, keys, "ctl", args.control, args.tokens, rng)}
        results["tagged"] = two_tenants(client, keys, "acme", "beta", args.lm, args.tokens, rng)
        results["untagged"] = two_tenants(client, keys, "acme-u", "beta-u", args.lm, args.tokens, rng)
        results["canary"] = {pool: client.post("/admin/canary", params={"pool": pool}, headers=admin).json()
                             for pool in ("lm", "lm-untagged")}
        results["audit"] = settled_audit(client, admin)
        results["gateway_metrics"] = [line for line in client.get("/metrics", headers=admin).text.splitlines()
                                      if line.startswith(("kvgate_isolation_canary_total", "kvgate_kv_blocks"))]
    return results


def settled_audit(client: httpx.Client, admin: dict[str, str], deadline_s: float = 20.0) -> dict[str, Any]:
    """The audit once two reads in a row agree on every tenant's counts (the last KV events have landed)."""
    end = time.monotonic() + deadline_s
    previous = None
    while True:
        report: dict[str, Any] = client.get("/admin/audit", headers=admin).json()
        counts = {(tenant, medium): (view["stored"], view["removed"]) for tenant, media in report["tenants"].items()
                  for medium, view in media.items()}
        if counts == previous or time.monotonic() > end:
            return report
        previous = counts
        time.sleep(0.5)


def markdown(results: dict[str, Any]) -> str:
    lines = ["| step | tenant | TTFT ms | cached tokens | upstream counters (delta) |", "|---|---|---|---|---|"]
    for arm, view in results["returning_prefix"].items():
        for step in ("cold", "return"):
            extra = view["upstream_counters_delta"] if step == "return" else ""
            lines.append(f"| {arm} {step} | {view['tenant']} | {view[step]['ttft_ms']} | "
                         f"{view[step]['cached_tokens']} | {extra} |")
    for name in ("tagged", "untagged"):
        view = results[name]
        lines.append(f"| {name}: second tenant, same prompt | {view['second']} | {view['second_result']['ttft_ms']} | "
                     f"{view['second_result']['cached_tokens']} | {view['upstream_counters_delta_during_second']} |")
    for pool, reply in results["canary"].items():
        for outcome in reply.get("outcomes", []):
            lines.append(f"| canary {pool} | - | - | B: {outcome['cached_tokens_b']} | {outcome['result']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    policies = commands.add_parser("policies")
    policies.add_argument("directory", type=Path)
    policies.add_argument("--lm", required=True)
    policies.add_argument("--control", required=True)
    policies.add_argument("--events")
    go = commands.add_parser("run")
    for flag in ("--gateway", "--keys", "--lm", "--control", "--out"):
        go.add_argument(flag, required=True)
    go.add_argument("--tokens", type=int, default=8000)
    go.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.command == "policies":
        write_policies(args.directory, args.lm, args.control, args.events)
        return
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    (out / "results.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    main()
