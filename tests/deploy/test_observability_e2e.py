"""End to end: a real Prometheus, configured from deploy/prometheus/prometheus.yml and its rule files, scrapes a
running gateway (with its metrics key) and two simulated vLLM servers (offload and control) after a short
multi-tenant workload. Every recording rule and alert evaluates without error, the alerts the scenario
provokes fire, every dashboard query evaluates, and the per-tenant series the dashboard needs are there.

The scenario, on purpose: globex may keep blocks on the GPU only but its offload is not capped (medium
violations); the control server corrupts deterministic outputs (shadow mismatches for acme, whose every
request is mirrored); the offload server keeps one batch for replay and publishes before the gateway
subscribes (a KV-event gap); some requests fail upstream (5xx) and some present bad keys (auth failures).
umbrella, outside the multi-tenant workload, exercises the protection and offload-economics panels: a steering
field dropped by policy, a per-minute limit run out, admission `returning` and a miss path that retries a failing
upstream; one client sends bytes that are not HTTP (a connection closed as malformed).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import yaml

from gateway.devtools.demo.workload import users_for
from tests.deploy.checks import concrete, dashboard_exprs, exposed_families
from tests.deploy.tools import DEPLOY, output, run, system_tool
from tests.harness import PolicyDir, bearer, new_secret, run_gateway
from tests.procs import ServerProcess, free_port, free_port_pair, kvgate_command, run_server

MODEL = "sim-model"
TENANTS = ("acme", "globex", "initech")
PREFIX_TOKENS = 1200  # the simulator's tokenizer is byte-level
GPU_BLOCKS = "256"  # 4,096 tokens: the workload's prefixes overflow it, so blocks are evicted and removed
CPU_TIER_BYTES = "10000000000"
DEADLINE_S = 60.0
PROTECTED_PER_MINUTE = 3
T = TypeVar("T")


@dataclass
class Observed:
    prometheus: str
    gateway: ServerProcess
    metrics_key: str

    def query(self, expr: str) -> dict[str, Any]:
        reply = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr}, timeout=10)
        body: dict[str, Any] = reply.json()
        return body

    def series(self, expr: str) -> list[dict[str, Any]]:
        body = self.query(expr)
        assert body["status"] == "success", f"{expr}: {body}"
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def wait_scraped(self, expr: str, count: int = 1) -> None:
        poll(lambda: len(self.series(expr)) >= count or None, f"Prometheus to scrape {count} series of {expr}")

    def api(self, path: str) -> Any:
        body = httpx.get(f"{self.prometheus}/api/v1/{path}", timeout=10).json()
        assert body["status"] == "success", body
        return body["data"]


def poll(check: Callable[[], T | None], what: str, deadline_s: float = DEADLINE_S) -> T:
    """Poll a condition with a deadline (Prometheus scrapes and evaluates on its own clock)."""
    deadline = time.monotonic() + deadline_s
    while True:
        result = check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)  # polling Prometheus's HTTP API, not synchronisation


def sim(stack: ExitStack, workdir: Path, name: str, key: str, events_port: int, *extra: str) -> ServerProcess:
    port = free_port()
    argv = kvgate_command("sim", "--port", str(port), f"--api-key={key}", "--gpu-blocks", GPU_BLOCKS,
                          "--kv-events-endpoint", f"tcp://*:{events_port}",
                          "--kv-events-replay-endpoint", f"tcp://*:{events_port + 1}", *extra)
    return stack.enter_context(run_server(argv, port, workdir / f"sim-{name}.log", ready_path="/health"))


def policies(root: Path, sims: dict[str, tuple[ServerProcess, int]]) -> tuple[PolicyDir, str]:
    pools = {name: {"upstreams": [server.url], "api_key_env": f"VLLM_E2E_{name.upper()}_KEY",
                    "kv_events": [f"tcp://127.0.0.1:{port}"]} for name, (server, port) in sims.items()}
    policy = PolicyDir(root, pools, public_paths=["/livez", "/readyz"])
    policy.add_tenant("acme", shadow={"pool": "control", "sample": 1.0, "max_in_flight": 8})
    policy.add_tenant("globex", offload={"allowed_media": ["GPU"], "retention_seconds": 600})
    policy.add_tenant("initech", rollout={"pool": "offload", "percent": 50, "else_pool": "control", "sticky": "user"})
    policy.add_tenant("umbrella", offload={"admission": "returning", "miss_path": "retry"},
                      limits={"requests_per_minute": PROTECTED_PER_MINUTE})
    metrics_key = policy.add_tenant("ops", scopes=("metrics",))
    policy.write()
    return policy, metrics_key


def prometheus_config(workdir: Path, gateway: ServerProcess, sims: dict[str, ServerProcess], key_file: Path) -> Path:
    """deploy/prometheus/prometheus.yml with loopback targets, a 1 s cadence and absolute rule-file paths;
    jobs, metrics paths, authorization and target labels stay as committed."""
    config: dict[str, Any] = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    config["rule_files"] = [str(DEPLOY / "prometheus" / path) for path in config["rule_files"]]
    for job in config["scrape_configs"]:
        for group in job["static_configs"]:
            if job["job_name"] == "kvgate":
                group["targets"] = [f"127.0.0.1:{gateway.port}"]
                job["authorization"]["credentials_file"] = str(key_file)
            else:
                group["targets"] = [f"127.0.0.1:{sims[group['labels']['pool']].port}"]
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def prefix(owner: str, index: int) -> str:
    return " ".join(f"{owner}-doc{index}-w{word}" for word in range(PREFIX_TOKENS // 8))[:PREFIX_TOKENS]


def complete(client: httpx.Client, key: str, user: str, prompt: str) -> int:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "user": user, "stream": True,
            "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body, headers=bearer(key)) as reply:
        for _ in reply.iter_lines():
            pass
        return reply.status_code


def workload(gateway_url: str, keys: dict[str, str], scraped: Callable[[str], None]) -> None:
    """Cold prefixes, repeats (GPU hits), pressure that evicts them, returns (CPU-tier loads on offload); twice
    pressure and return, with a wait in between until Prometheus has scraped the first loads: a counter child
    is born at its first increment, and rate() cannot see that first step."""
    owners = [(tenant, user, index) for tenant in TENANTS
              for index, user in enumerate(users_for(tenant, 4 if tenant == "initech" else 2))]

    def pressure(round_no: int) -> list[tuple[str, str, str]]:
        return [(t, u, prefix(f"{t}-noise{round_no}", i)) for t, u, i in owners]

    def ask(question: str) -> list[tuple[str, str, str]]:
        return [(t, u, f"{prefix(t, i)} {question}") for t, u, i in owners]

    with httpx.Client(base_url=gateway_url, timeout=60) as client, ThreadPoolExecutor(4) as pool:
        def send(steps: list[tuple[str, str, str]]) -> None:
            statuses = list(pool.map(lambda step: complete(client, keys[step[0]], step[1], step[2]), steps))
            assert statuses == [200] * len(steps)

        for steps in (ask("Summarise."), ask("List the key terms."), pressure(0), ask("What changed?")):
            send(steps)
        scraped('vllm:kv_offload_load_bytes_total{pool="offload"}')
        send(pressure(1))
        send(ask("And now?"))
        for headers in ({"Authorization": "Bearer kvg_not-a-key"}, {"Authorization": "Bearer kvg_still-not"}, {}):
            assert client.get("/v1/models", headers=headers).status_code == 401


def upstream_errors(gateway_url: str, keys: dict[str, str]) -> None:
    with httpx.Client(base_url=gateway_url, timeout=60) as client:
        for tenant in TENANTS:
            user = users_for(tenant, 1)[0]  # one user: a split tenant's failures all land on one pool
            failed = client.post("/v1/completions", headers=bearer(keys[tenant]), json={
                "model": MODEL, "prompt": "fail [[sim:status=503]]", "max_tokens": 2, "user": user})
            assert failed.status_code == 503


def publish_unseen_batches(offload: ServerProcess, key: str) -> None:
    """KV-event batches published before any subscriber, beyond the replay buffer: a gap for the gateway."""
    for index in range(3):
        reply = httpx.post(f"{offload.url}/v1/completions", headers=bearer(key), timeout=30,
                           json={"model": MODEL, "prompt": prefix("before-gateway", index), "max_tokens": 2})
        assert reply.status_code == 200


def protections(gateway: ServerProcess, key: str) -> None:
    """umbrella's requests: a dropped steering field, a miss path that fails again, then 429 from its per-minute
    limit; and one connection that speaks no HTTP."""
    with httpx.Client(base_url=gateway.url, headers=bearer(key), timeout=60) as client:
        steered = {"model": MODEL, "prompt": prefix("umbrella", 0), "max_tokens": 2, "priority": 5}
        assert client.post("/v1/completions", json=steered).status_code == 200
        failing = {"model": MODEL, "prompt": "fail [[sim:status=503]]", "max_tokens": 2}
        assert client.post("/v1/completions", json=failing).status_code == 503
        statuses = [client.post("/v1/completions", json=steered).status_code for _ in range(PROTECTED_PER_MINUTE)]
        assert 429 in statuses, statuses
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as raw:
        raw.sendall(b"\x16\x03\x01 not http\r\n\r\n")
        while raw.recv(4096):  # until the gateway closes the connection
            pass


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    workdir = tmp_path_factory.mktemp("observability")
    upstream_keys = {"offload": "e2e-offload-key", "control": "e2e-control-key"}
    with ExitStack() as stack:
        ports = {name: free_port_pair() for name in upstream_keys}
        servers = {
            "offload": sim(stack, workdir, "offload", upstream_keys["offload"], ports["offload"], "--offload",
                           "--cpu-bytes-to-use", CPU_TIER_BYTES, "--kv-events-buffer-steps", "1"),
            "control": sim(stack, workdir, "control", upstream_keys["control"], ports["control"], "--corrupt-output"),
        }
        publish_unseen_batches(servers["offload"], upstream_keys["offload"])
        policy, metrics_key = policies(workdir / "policies",
                                                  {name: (servers[name], ports[name]) for name in servers})
        env = {f"VLLM_E2E_{name.upper()}_KEY": key for name, key in upstream_keys.items()}
        env["KVGATE_OTEL_METRICS"] = "true"
        gateway = stack.enter_context(run_gateway(policy.root, workdir / "gateway.log", new_secret(), env))
        key_file = workdir / "metrics.key"
        key_file.write_text(metrics_key + "\n")
        port = free_port()
        argv = [system_tool("prometheus"), f"--config.file={prometheus_config(workdir, gateway, servers, key_file)}",
                f"--storage.tsdb.path={workdir / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"]
        prometheus = stack.enter_context(run_server(argv, port, workdir / "prometheus.log", ready_path="/-/ready"))
        observed = Observed(prometheus.url, gateway, metrics_key)
        poll(lambda: all_targets_up(observed), "every scrape target to be up")
        keys = {tenant: policy.keys[tenant] for tenant in TENANTS}
        workload(gateway.url, keys, observed.wait_scraped)
        # The same for the 5xx counters: fail once, wait for the scrape, fail again so the error rate shows.
        upstream_errors(gateway.url, keys)
        observed.wait_scraped('sum by (tenant) (kvgate_requests_total{status="503"}) >= 1', len(TENANTS))
        upstream_errors(gateway.url, keys)
        observed.wait_scraped('sum by (tenant) (kvgate_requests_total{status="503"}) >= 2', len(TENANTS))
        protections(gateway, policy.keys["umbrella"])
        yield observed


def all_targets_up(observed: Observed) -> bool | None:
    targets = observed.api("targets?state=active")["activeTargets"]
    healthy = len(targets) == 3 and all(target["health"] == "up" for target in targets)
    return True if healthy else None


def rule_groups(observed: Observed) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = observed.api("rules")["groups"]
    return groups


def test_every_rule_evaluates_without_error(observed: Observed) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        rules = [rule for group in rule_groups(observed) for rule in group["rules"]]
        fresh = all(not rule["lastEvaluation"].startswith("0001-") for rule in rules)
        return rules if rules and fresh else None

    rules = poll(evaluated, "every rule to be evaluated")
    committed = [rule for path in sorted((DEPLOY / "prometheus" / "rules").glob("*.yml"))
                 for group in yaml.safe_load(path.read_text())["groups"] for rule in group["rules"]]
    assert len(rules) == len(committed)
    broken = [(rule["name"], rule.get("lastError")) for rule in rules
              if rule["health"] != "ok" or rule.get("lastError")]
    assert not broken
    for rule in committed:
        assert observed.query(rule["expr"])["status"] == "success", rule


def test_alerts_fire_for_what_the_scenario_provoked(observed: Observed) -> None:
    wanted = {("KvgateRetentionViolation", "tenant", "globex", "firing"),
              ("KvgateKvEventGap", "source", "offload/0", "firing"),
              ("KvgateShadowOutputMismatch", "tenant", "acme", "firing"),
              # for: 5m, so pending is as far as it gets here; every tenant had 5xx answers
              *(("KvgateUpstreamErrorRate", "tenant", tenant, "pending") for tenant in TENANTS)}

    def active() -> set[tuple[str, str, str, str]] | None:
        alerts = observed.api("alerts")["alerts"]
        seen = {(alert["labels"]["alertname"], label, alert["labels"].get(label, ""), alert["state"])
                for alert in alerts for label in ("tenant", "source")}
        return seen if wanted <= seen else None

    poll(active, f"alerts {sorted(wanted)}")
    alerts = observed.api("alerts")["alerts"]
    violation = next(alert for alert in alerts if alert["labels"]["alertname"] == "KvgateRetentionViolation")
    assert violation["labels"]["kind"] == "medium" and violation["labels"]["severity"] == "critical"
    assert not [alert for alert in alerts if alert["labels"]["alertname"] in ("KvgateDown", "VllmDown")]


def test_every_dashboard_query_returns_series(observed: Observed) -> None:
    exprs = [(title, concrete(expr)) for title, expr in
             dashboard_exprs(json.loads((DEPLOY / "grafana" / "dashboards" / "kvgate.json").read_text()))]
    assert len(exprs) >= 20

    def all_present() -> dict[str, list[dict[str, Any]]] | None:
        results = {expr: observed.series(expr) for _, expr in exprs}
        return results if all(results.values()) else None

    try:
        results = poll(all_present, "every dashboard query to return data")
    except AssertionError:
        empty = [(title, expr) for title, expr in exprs if not observed.series(expr)]
        raise AssertionError(f"dashboard queries without data: {empty}") from None

    def labels(title: str, *names: str) -> set[tuple[str, ...]]:
        found = set()
        for panel, expr in exprs:
            if panel == title:
                found |= {tuple(series["metric"].get(name, "") for name in names) for series in results[expr]}
        return found

    assert {(tenant,) for tenant in TENANTS} <= labels("Requests by tenant and status", "tenant")
    assert {("initech", "offload"), ("initech", "control"), ("acme", "offload"), ("globex", "offload")} <= labels(
        "TTFT p50 by tenant and pool", "tenant", "pool")
    assert ("acme",) in labels("Shadow ΔTTFT (offload − control) by tenant", "tenant")
    assert ("acme",) in labels("Shadow output mismatches by tenant", "tenant")
    assert ("globex", "medium") in labels("Retention and medium violations by tenant", "tenant", "kind")
    resident = labels("Resident KV blocks by tenant and medium", "tenant", "medium")
    assert {(tenant, "GPU") for tenant in TENANTS} <= resident
    assert ("offload/0",) in labels("Missed KV-event batches by source", "source")
    assert {("offload",), ("control",)} <= labels("vLLM prefix cache hit ratio by pool", "pool")
    assert ("malformed",) in labels("Connections closed by reason", "reason")
    assert ("umbrella", "requests_per_minute") in labels("Rate-limited requests by tenant and limit", "tenant", "limit")
    assert ("umbrella", "priority", "dropped") in labels("Engine fields dropped or refused by tenant", "tenant",
                                                         "field", "action")
    assert {("umbrella", decision) for decision in ("returning", "new", "short")} <= labels(
        "Offload admission decisions by tenant", "tenant", "decision")
    retried = labels("Miss-path retries by action and result", "tenant", "pool", "result")
    assert ("umbrella", "offload", "failed") in retried
    assert {("offload",), ("control",)} <= labels("Isolation canary probes by pool and result", "pool")
    # Nothing in the scenario breaks the gateway or its ledger: those panels show "none" at 0, because it is scraped.
    assert labels("Internal errors by route", "route") == {("none",)}
    assert labels("Ledger store errors by kind", "kind") == {("none",)}
    assert labels("Ledger task restarts by task", "task") == {("none",)}


def test_none_fallback_is_empty_when_no_gateway_is_scraped(observed: Observed) -> None:
    """Unknown is never shown as 0: with no kvgate target up, a fallback panel has no data at all."""
    gated = [(title, concrete(expr)) for title, expr in
             dashboard_exprs(json.loads((DEPLOY / "grafana" / "dashboards" / "kvgate.json").read_text()))
             if 'up{job="kvgate"}' in expr]
    assert len(gated) == 3
    for title, expr in gated:
        assert observed.series(expr), title
        assert observed.series(expr.replace('up{job="kvgate"}', 'up{job="kvgate-elsewhere"}')) == [], title


def test_every_gateway_family_has_a_panel_and_every_panel_family_exists(observed: Observed) -> None:
    """The live exposition (families are listed even before their first child) against the dashboard's queries."""
    exposition = httpx.get(f"{observed.gateway.url}/metrics", headers=bearer(observed.metrics_key), timeout=10).text
    families = {family for family in exposed_families(exposition) if family.startswith("kvgate_")}
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "kvgate.json").read_text())
    queried = {re.sub(r"_(bucket|count|sum)$", "", name) for _, expr in dashboard_exprs(dashboard)
               for name in re.findall(r"kvgate_[a-z_]+", expr)}
    assert families - queried == set(), "gateway metrics without a panel"
    assert queried - families == set(), "panels on metrics the gateway does not expose"


def test_per_tenant_recording_rules_have_data(observed: Observed) -> None:
    def present(expr: str) -> list[dict[str, Any]] | None:
        return observed.series(expr) or None

    ttft = poll(lambda: present("tenant_pool:kvgate_ttft_seconds:p50_5m"), "per-tenant TTFT p50")
    assert {series["metric"]["tenant"] for series in ttft} == set(TENANTS)
    assert poll(lambda: present('tenant:kvgate_ttft_seconds:p50_offload_minus_control_5m{tenant="initech"}'),
                "initech's offload − control TTFT")
    load = poll(lambda: present('pool:vllm_kv_offload_load_bytes:rate5m{pool="offload"} > 0'),
                "CPU-tier loads on the offload pool")
    assert load
    hit = poll(lambda: present('tenant_pool:kvgate_prefix_cache_hit:ratio_rate5m{tenant="acme"} > 0'),
               "acme's cached prompt tokens")
    assert hit


def test_live_gateway_metrics_pass_promtool_check_metrics(observed: Observed) -> None:
    exposition = httpx.get(f"{observed.gateway.url}/metrics", headers=bearer(observed.metrics_key), timeout=10)
    assert exposition.status_code == 200
    result = run([system_tool("promtool"), "check", "metrics"], stdin=exposition.text)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), output(result)
    assert "kvgate_retention_violations_total" in exposition.text


def test_otel_genai_metrics_are_exposed_when_enabled(observed: Observed) -> None:
    """KVGATE_OTEL_METRICS=true: the GenAI-convention families appear next to kvgate_* on the live gateway."""
    exposition = httpx.get(f"{observed.gateway.url}/metrics", headers=bearer(observed.metrics_key), timeout=10).text
    for family in ("gen_ai_server_request_duration_seconds", "gen_ai_server_time_to_first_token_seconds",
                   "gen_ai_server_time_per_output_token_seconds", "gen_ai_client_token_usage"):
        assert f"# TYPE {family} histogram" in exposition, family
    assert 'gen_ai_operation_name="text_completion"' in exposition
    assert 'error_type="503"' in exposition
    assert observed.series('sum by (gen_ai_request_model) (gen_ai_server_request_duration_seconds_count)')
