"""The Helm chart: strict lint and render of a matrix of values files with the Helm v4 SDK, every object through
kubernetes-validate --strict, the values files through the chart's JSON schema, the rendered policy ConfigMap
through `kvgate policy check`, and hot reload across a kubelet-style ConfigMap swap on a real gateway."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.keys import hash_key, new_key
from tests.deploy.checks import (
    CHART,
    LEDGER_SAMPLES,
    LEDGER_SETTINGS,
    LIMIT_SAMPLES,
    LIMIT_SETTINGS,
    helm_problems,
    helm_report,
    kubernetes_problems,
    ledger_defaults,
    ledger_problems,
    limit_defaults,
    limit_problems,
    manifests,
    schema_problems,
    setting_env_names,
)
from tests.deploy.tools import DEPLOY, DeployTools, output, run
from tests.harness import bearer, new_secret
from tests.procs import ServerProcess, free_port, kvgate_command, run_server

CI_VALUES = CHART / "ci" / "production-values.yaml"
EXAMPLE_DIR = DEPLOY / "helm" / "examples" / "production-stack"
EXAMPLE_VALUES = EXAMPLE_DIR / "kvgate-values.yaml"
VLLM_STACK_VALUES = EXAMPLE_DIR / "vllm-stack-values.yaml"
VALUES_FILES = {"defaults": None, "production": CI_VALUES, "production-stack": EXAMPLE_VALUES}
SETTINGS_ENV = setting_env_names()
# values.limits set to LIMIT_SAMPLES; 2,000,000 would render as 2e+06 without int64.
LIMIT_OVERRIDES: dict[str, Any] = {
    "maxHeaderBytes": 32768, "headerTimeoutSeconds": 2.5, "idleTimeoutSeconds": 30, "bodyTimeoutSeconds": 120,
    "maxConnections": 10000, "maxInFlight": 256, "jsonMaxDepth": 32, "jsonMaxItems": 2_000_000,
    "connectTimeoutSeconds": 1.5, "readTimeoutSeconds": 900, "upstreamConnections": 4096,
    "admissionSketchWidth": 4096,
    "reuseTrace": {"enabled": False, "blockTokens": 64, "sampleRate": 0.25, "maxRoots": 5000, "maxRecords": 1_500_000},
}
# values.ledger set to LEDGER_SAMPLES.
LEDGER_OVERRIDES: dict[str, Any] = {
    "flushIntervalSeconds": 0.5, "spoolEvents": 400_000, "replayTimeoutSeconds": 3.5, "probeIntervalSeconds": 10,
    "lostAfterSeconds": 60, "saltRefreshSeconds": 2.5, "sweepIntervalSeconds": 15, "compactAfterSeconds": 1_209_600,
    "compactIntervalSeconds": 1800, "knownHashes": 3_000_000, "sqliteBusyTimeoutMs": 20_000, "userSalts": 250_000,
    "redisPrefix": "team-a:ledger:",
}


def load_values(path: Path | None) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) if path is not None else {}


@pytest.fixture(scope="module")
def rendered(deploy_tools: DeployTools) -> dict[str, Any]:
    return helm_report(deploy_tools, CHART, {name: load_values(path) for name, path in VALUES_FILES.items()})


def objects_of(rendered: dict[str, Any], case: str) -> list[dict[str, Any]]:
    assert helm_problems(rendered[case]) == []
    return manifests(rendered[case])


def find(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == kind]


@pytest.mark.parametrize("case", VALUES_FILES)
def test_lint_is_clean_and_every_object_validates(
    case: str, rendered: dict[str, Any], deploy_tools: DeployTools, tmp_path: Path
) -> None:
    assert helm_problems(rendered[case]) == []
    objects = manifests(rendered[case])
    assert kubernetes_problems(deploy_tools, objects, tmp_path) == []
    kinds = {obj["kind"] for obj in objects}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount"} <= kinds


def test_values_files_match_the_values_schema(deploy_tools: DeployTools) -> None:
    files = [CHART / "values.yaml", *(path for path in VALUES_FILES.values() if path is not None)]
    assert schema_problems(deploy_tools, CHART / "values.schema.json", files) == []


def test_optional_objects_follow_their_switches(rendered: dict[str, Any]) -> None:
    defaults, production = objects_of(rendered, "defaults"), objects_of(rendered, "production")
    assert not find(defaults, "ServiceMonitor") and not find(defaults, "NetworkPolicy")
    (monitor,) = find(production, "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["path"] == "/metrics" and endpoint["authorization"]["type"] == "Bearer"
    assert endpoint["authorization"]["credentials"] == {"name": "kvgate-metrics-key", "key": "key"}
    (service,) = [obj for obj in find(production, "Service") if obj["metadata"]["name"] == "kvgate"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (deployment,) = find(production, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert find(production, "PodDisruptionBudget")[0]["spec"]["minAvailable"] == 2


def container_env(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {entry["name"]: entry for entry in container["env"]}


@pytest.mark.parametrize("case", VALUES_FILES)
def test_pod_gets_settings_secrets_and_probes(case: str, rendered: dict[str, Any]) -> None:
    objects = objects_of(rendered, case)
    (deployment,) = find(objects, "Deployment")
    env = container_env(deployment)
    unknown = {name for name in env if name.startswith("KVGATE_")} - SETTINGS_ENV
    assert not unknown, f"not kvgate settings (pydantic-settings would silently ignore them): {unknown}"
    assert env["KVGATE_SALT_SECRET"]["valueFrom"]["secretKeyRef"]["name"]
    assert "value" not in env["KVGATE_SALT_SECRET"]
    gateway = yaml.safe_load(find(objects, "ConfigMap")[0]["data"]["gateway.yaml"])
    for pool in gateway["pools"].values():
        if pool.get("api_key_env"):
            assert "secretKeyRef" in env[pool["api_key_env"]]["valueFrom"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"/livez", "/readyz"} <= set(gateway["public_paths"]), "probes carry no key"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mount = next(m for m in container["volumeMounts"] if m["name"] == "policies")
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates"


def env_values(deployment: dict[str, Any]) -> dict[str, str]:
    return {name: entry["value"] for name, entry in container_env(deployment).items() if "value" in entry}


@pytest.mark.parametrize("case", VALUES_FILES)
def test_limits_render_as_kvgate_defaults(case: str, rendered: dict[str, Any]) -> None:
    (deployment,) = find(objects_of(rendered, case), "Deployment")
    assert limit_problems(env_values(deployment), limit_defaults()) == []


def test_every_limit_value_reaches_the_pod(deploy_tools: DeployTools) -> None:
    assert set(LIMIT_SAMPLES) == set(LIMIT_SETTINGS)
    case = helm_report(deploy_tools, CHART, {"limits": {"limits": LIMIT_OVERRIDES}})["limits"]
    (deployment,) = find(objects_of({"limits": case}, "limits"), "Deployment")
    assert limit_problems(env_values(deployment), LIMIT_SAMPLES) == []


@pytest.mark.parametrize("case", VALUES_FILES)
def test_ledger_settings_render_as_kvgate_defaults(case: str, rendered: dict[str, Any]) -> None:
    """compactAfterSeconds is null by default: its variable is left out (an empty value would be refused)."""
    (deployment,) = find(objects_of(rendered, case), "Deployment")
    assert ledger_problems(env_values(deployment), ledger_defaults()) == []
    assert "KVGATE_LEDGER_COMPACT_AFTER_S" not in container_env(deployment)


def test_every_ledger_value_reaches_the_pod(deploy_tools: DeployTools) -> None:
    assert set(LEDGER_SAMPLES) == set(LEDGER_SETTINGS)
    case = helm_report(deploy_tools, CHART, {"ledger": {"ledger": LEDGER_OVERRIDES}})["ledger"]
    (deployment,) = find(objects_of({"ledger": case}, "ledger"), "Deployment")
    assert ledger_problems(env_values(deployment), LEDGER_SAMPLES) == []


def policy_dir_from(objects: list[dict[str, Any]], root: Path) -> Path:
    """Lay the ConfigMap out as the kubelet does for the Deployment's volume: only the listed items, at their
    paths, behind a `..data` symlink that is swapped on every update."""
    (deployment,) = find(objects, "Deployment")
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "policies")
    name = volume["configMap"]["name"]
    (config_map,) = [obj for obj in find(objects, "ConfigMap") if obj["metadata"]["name"] == name]
    return kubelet_write(root, config_map["data"], volume["configMap"]["items"])


def kubelet_write(root: Path, data: dict[str, str], items: list[dict[str, str]]) -> Path:
    """The kubelet's atomic writer: a fresh timestamped directory, then an atomic rename of `..data`."""
    root.mkdir(parents=True, exist_ok=True)
    version = root / f"..{time.monotonic_ns()}"
    for item in items:
        target = version / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(data[item["key"]])
    staging = root / "..data_tmp"
    staging.symlink_to(version.name)
    os.replace(staging, root / "..data")
    for top in {Path(item["path"]).parts[0] for item in items}:
        link = root / top
        if not link.is_symlink():
            link.symlink_to(Path("..data") / top)
    return root


@pytest.mark.parametrize("case", VALUES_FILES)
def test_rendered_policy_configmap_is_a_valid_policy_directory(
    case: str, rendered: dict[str, Any], tmp_path: Path
) -> None:
    objects = objects_of(rendered, case)
    policy_dir = policy_dir_from(objects, tmp_path / "policies")
    result = run(kvgate_command("policy", "check", str(policy_dir)))
    assert result.returncode == 0, output(result)
    tenants = {path.stem for path in (policy_dir / "tenants").glob("*.yaml")}
    configured = load_values(VALUES_FILES[case]).get("policies", {}).get("tenants")
    expected = configured if configured is not None else load_values(CHART / "values.yaml")["policies"]["tenants"]
    assert tenants == {tenant["tenant"] for tenant in expected}


def reload_case(admin_key: str, tenants: list[str], upstream: str) -> dict[str, Any]:
    tenant_entries = [{"tenant": name, "keys": [{"sha256": hash_key(admin_key if name == "ops" else new_key()),
                                                  "scopes": ["admin"] if name == "ops" else ["inference"]}]}
                      for name in tenants]
    return {"policies": {"pools": [{"name": "offload", "upstreams": [upstream]}], "defaultPool": "offload",
                         "tenants": tenant_entries}}


@contextmanager
def gateway_on(policy_dir: Path, workdir: Path) -> Iterator[ServerProcess]:
    port = free_port()
    env = {"KVGATE_SALT_SECRET": new_secret(), "KVGATE_STATE_PATH": str(workdir / "state.sqlite3"),
           "KVGATE_RELOAD_INTERVAL_S": "0.2"}
    argv = kvgate_command("serve", "--policies", str(policy_dir), "--port", str(port))
    with run_server(argv, port, workdir / "gateway.log", env=env, ready_path="/livez") as server:
        yield server


def test_configmap_update_reaches_a_running_gateway(deploy_tools: DeployTools, tmp_path: Path) -> None:
    """A `helm upgrade` that adds a tenant: the kubelet swaps `..data`; kvgate follows without a restart."""
    admin_key, upstream = new_key(), f"http://127.0.0.1:{free_port()}"
    cases = {"before": reload_case(admin_key, ["acme", "ops"], upstream),
             "after": reload_case(admin_key, ["acme", "ops", "newco"], upstream)}
    report = helm_report(deploy_tools, CHART, cases)
    root = policy_dir_from(manifests(report["before"]), tmp_path / "policies")
    with gateway_on(root, tmp_path) as gateway:
        client = httpx.Client(base_url=gateway.url, headers=bearer(admin_key), timeout=10)
        assert sorted(client.get("/admin/policies").json()["tenants"]) == ["acme", "ops"]
        assert httpx.get(f"{gateway.url}/readyz", timeout=10).status_code == 200, "/readyz must be public"
        policy_dir_from(manifests(report["after"]), root)
        deadline = time.monotonic() + 15
        while sorted(client.get("/admin/policies").json()["tenants"]) != ["acme", "newco", "ops"]:
            assert time.monotonic() < deadline, gateway.log_text()[-3000:]
            time.sleep(0.1)  # polling the admin API until the reload shows, not synchronisation


def test_render_time_guards(deploy_tools: DeployTools) -> None:
    """What the schema cannot say is refused at render time, with a message naming the fix."""
    report = helm_report(deploy_tools, CHART, {
        "replicas-without-redis": {"replicaCount": 2},
        "unmapped-upstream-key": {"policies": {"pools": [
            {"name": "offload", "upstreams": ["http://v:8000"], "api_key_env": "VLLM_KEY"}]}},
        "probe-path-not-public": {"policies": {"publicPaths": ["/livez"]}},
        "duplicate-tenant": {"policies": {"tenants": [
            {"tenant": "a", "keys": []}, {"tenant": "a", "keys": []}]}},
        "empty-network-selector": {"networkPolicy": {"enabled": True}},
        "schema-violation": {"replicaCount": 0},
        "limits-too-deep": {"limits": {"jsonMaxDepth": 1000}},
        "limits-sketch-not-a-power-of-two": {"limits": {"admissionSketchWidth": 1000}},
        "limits-misspelt": {"limits": {"maxHeadersBytes": 8192}},
        "limits-zero-timeout": {"limits": {"idleTimeoutSeconds": 0}},
        "ledger-spool-too-small": {"ledger": {"spoolEvents": 1000}},
        "ledger-misspelt": {"ledger": {"flushIntervalSecs": 1}},
        "ledger-empty-horizon": {"ledger": {"compactAfterSeconds": ""}},
    })
    expected = {"replicas-without-redis": "needs redis.url", "unmapped-upstream-key": "secrets.upstreamKeys",
                "probe-path-not-public": "/readyz", "duplicate-tenant": "listed twice",
                "empty-network-selector": "podSelector", "schema-violation": "minimum",
                "limits-too-deep": "maximum", "limits-sketch-not-a-power-of-two": "admissionSketchWidth",
                "limits-misspelt": "maxHeadersBytes", "limits-zero-timeout": "idleTimeoutSeconds",
                "ledger-spool-too-small": "minimum", "ledger-misspelt": "flushIntervalSecs",
                "ledger-empty-horizon": "compactAfterSeconds"}
    for case, words in expected.items():
        problems = helm_problems(report[case])
        assert any(words in problem for problem in problems), (case, problems)


def test_network_policy_admits_only_kvgate_and_prometheus(rendered: dict[str, Any]) -> None:
    (policy,) = find(objects_of(rendered, "production-stack"), "NetworkPolicy")
    values = load_values(EXAMPLE_VALUES)["networkPolicy"]["vllm"]
    assert policy["spec"]["podSelector"]["matchLabels"] == values["podSelector"]["matchLabels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    kvgate_rule, prometheus_rule = policy["spec"]["ingress"]
    assert kvgate_rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "kvgate", "app.kubernetes.io/instance": "kvgate"}}}]
    assert {port["port"] for port in kvgate_rule["ports"]} == {values["httpPort"], *values["kvEventPorts"]}
    assert [port["port"] for port in prometheus_rule["ports"]] == [values["httpPort"]]
    assert prometheus_rule["from"][0]["namespaceSelector"] == values["prometheus"]["namespaceSelector"]


def test_production_stack_example_matches_its_vllm_stack_values(rendered: dict[str, Any]) -> None:
    """kvgate-values.yaml must point at what production-stack creates from vllm-stack-values.yaml (release `vllm`):
    Services `<release>-<model>-engine-service` on servicePort, pods labelled model/helm-release-name, the
    KV-event ports of each engine's --kv-events-config, and the Secret behind VLLM_API_KEY."""
    stack, ours = load_values(VLLM_STACK_VALUES), load_values(EXAMPLE_VALUES)
    engine = stack["servingEngineSpec"]
    pods = {spec["name"]: {"model": spec["name"], "helm-release-name": "vllm", **engine["labels"]}
            for spec in engine["modelSpec"]}
    assert stack["routerSpec"]["enableRouter"] is False, "kvgate replaces the router"
    pools = {pool["name"]: pool for pool in ours["policies"]["pools"]}
    assert set(pools) == set(pods)
    offload = next(spec for spec in engine["modelSpec"] if spec["name"] == "offload")
    control = next(spec for spec in engine["modelSpec"] if spec["name"] == "control")
    assert offload["lmcacheConfig"]["enabled"] and int(offload["lmcacheConfig"]["cpuOffloadingBufferSize"]) > 0
    assert "lmcacheConfig" not in control
    assert not any("kv-transfer" in arg for arg in control["vllmConfig"]["extraArgs"])
    event_services = {service["name"]: service for service in ours["kvEventServices"]}
    for spec in engine["modelSpec"]:
        pool = pools[spec["name"]]
        assert pool["upstreams"] == [f"http://vllm-{spec['name']}-engine-service:{engine['servicePort']}"]
        args = spec["vllmConfig"]["extraArgs"]
        events = yaml.safe_load(args[args.index("--kv-events-config") + 1])
        events_port, replay_port = (int(events[key].rsplit(":", 1)[1]) for key in ("endpoint", "replay_endpoint"))
        (endpoint,) = pool["kv_events"]
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        service = event_services[host]
        assert (int(port), service["eventsPort"], service["replayPort"]) == (events_port, events_port, replay_port)
        assert service["selector"].items() <= pods[spec["name"]].items()
        assert {events_port, replay_port} <= set(ours["networkPolicy"]["vllm"]["kvEventPorts"])
    selector = ours["networkPolicy"]["vllm"]["podSelector"]["matchLabels"]
    assert all(selector.items() <= labels.items() for labels in pods.values())
    secret = engine["vllmApiKey"]
    assert {(key["secretName"], key["secretKey"]) for key in ours["secrets"]["upstreamKeys"]} == {
        (secret["secretName"], secret["secretKey"])}
    assert objects_of(rendered, "production-stack")
