"""The compose project: `config -q` through the real Docker Compose v2 binary, the compose-spec schema, and the
wiring between its services, the policies, the Prometheus config and Grafana's provisioning."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.keys import hash_key
from tests.deploy.checks import (
    LEDGER_SAMPLES,
    LEDGER_SETTINGS,
    LIMIT_SAMPLES,
    compose_config,
    compose_problems,
    env_name,
    ledger_defaults,
    ledger_env_name,
    ledger_problems,
    limit_defaults,
    limit_problems,
    setting_env_names,
)
from tests.deploy.tools import DEPLOY, REPO, DeployTools, output, run
from tests.procs import kvgate_command

COMPOSE_DIR = DEPLOY / "compose"
COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SECRETS = ("KVGATE_SALT_SECRET", "VLLM_OFFLOAD_KEY", "VLLM_CONTROL_KEY", "GRAFANA_ADMIN_PASSWORD")
SETTINGS_ENV = setting_env_names()


@pytest.fixture(scope="module")
def env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What init.py writes, with dummy values; passed explicitly so a developer's own .env never leaks in."""
    path = tmp_path_factory.mktemp("compose") / "env"
    path.write_text("".join(f"{name}=test-{name.lower()}\n" for name in SECRETS))
    return path


@pytest.fixture(scope="module")
def project(deploy_tools: DeployTools, env_file: Path) -> dict[str, Any]:
    return compose_config(deploy_tools, COMPOSE_FILE, env_file)


def test_config_is_valid_for_the_real_compose_binary(deploy_tools: DeployTools, env_file: Path) -> None:
    assert compose_problems(deploy_tools, COMPOSE_FILE, env_file) == []


def test_config_refuses_to_run_without_the_secrets(deploy_tools: DeployTools, tmp_path: Path) -> None:
    empty = tmp_path / "empty.env"
    empty.write_text("")
    problems = compose_problems(deploy_tools, COMPOSE_FILE, empty)
    assert problems and "run deploy/compose/init.py first" in problems[0]


def test_services_and_isolation(project: dict[str, Any]) -> None:
    services = project["services"]
    assert set(services) == {"vllm-offload", "vllm-control", "kvgate", "redis", "prometheus", "grafana"}
    for name in ("vllm-offload", "vllm-control", "redis"):
        assert not services[name].get("ports"), f"{name} must not be published: only kvgate reaches it"
        assert set(services[name]["networks"]) == {"inference"}
    gpu = services["vllm-offload"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    kvgate = services["kvgate"]
    assert kvgate["read_only"] is True and kvgate["cap_drop"] == ["ALL"]
    assert {"inference", "observability"} == set(kvgate["networks"])


def vllm_flag(service: dict[str, Any], flag: str) -> str | None:
    for arg in service["command"]:
        if arg.startswith(f"{flag}="):
            return str(arg.split("=", 1)[1])
    return None


def test_offload_and_control_differ_only_by_the_connector(project: dict[str, Any]) -> None:
    offload, control = project["services"]["vllm-offload"], project["services"]["vllm-control"]
    transfer = json.loads(vllm_flag(offload, "--kv-transfer-config") or "{}")
    assert transfer["kv_connector"] == "OffloadingConnector" and transfer["kv_role"] == "kv_both"
    assert transfer["kv_connector_extra_config"]["cpu_bytes_to_use"] > 0
    assert vllm_flag(control, "--kv-transfer-config") is None
    strip = [arg for arg in offload["command"] if not arg.startswith("--kv-transfer-config")]
    assert strip == control["command"]


def test_kvgate_reaches_the_servers_the_policies_name(project: dict[str, Any]) -> None:
    services = project["services"]
    kvgate_env = services["kvgate"]["environment"]
    unknown = {name for name in kvgate_env if name.startswith("KVGATE_")} - SETTINGS_ENV
    assert not unknown, f"not kvgate settings (silently ignored): {unknown}"
    gateway = yaml.safe_load((COMPOSE_DIR / "policies" / "gateway.yaml").read_text())
    for pool, config in gateway["pools"].items():
        (upstream,) = config["upstreams"]
        host = urlsplit(upstream).hostname
        assert host in services, f"pool {pool}: {upstream} is not a compose service"
        assert urlsplit(upstream).port == 8000 and vllm_flag(services[host], "--port") == "8000"
        assert kvgate_env[config["api_key_env"]] == services[host]["environment"]["VLLM_API_KEY"]
        events = json.loads(vllm_flag(services[host], "--kv-events-config") or "{}")
        (endpoint,) = config["kv_events"]
        assert endpoint == f"tcp://{host}:{events['endpoint'].rsplit(':', 1)[1]}"
        assert int(events["replay_endpoint"].rsplit(":", 1)[1]) == int(endpoint.rsplit(":", 1)[1]) + 1
    mount = next(v for v in services["kvgate"]["volumes"] if v["target"] == kvgate_env["KVGATE_POLICIES"])
    assert mount["read_only"] is True and Path(mount["source"]) == COMPOSE_DIR / ".local" / "policies"


def test_kvgate_gets_every_limit_with_its_default(project: dict[str, Any]) -> None:
    assert limit_problems(project["services"]["kvgate"]["environment"], limit_defaults()) == []


def test_limits_follow_the_env_file(deploy_tools: DeployTools, env_file: Path, tmp_path: Path) -> None:
    """Every limit is `${VAR:-default}`: a line in .env changes it."""
    overridden = tmp_path / "env"
    lines = [f"{env_name(name)}={str(value).lower() if isinstance(value, bool) else value}\n"
             for name, value in LIMIT_SAMPLES.items()]
    overridden.write_text(env_file.read_text() + "".join(lines))
    project = compose_config(deploy_tools, COMPOSE_FILE, overridden)
    assert limit_problems(project["services"]["kvgate"]["environment"], LIMIT_SAMPLES) == []


def test_kvgate_gets_every_ledger_setting_with_its_default(project: dict[str, Any]) -> None:
    """KVGATE_LEDGER_COMPACT_AFTER_S is named without a value: unset in the container unless .env sets it."""
    environment = project["services"]["kvgate"]["environment"]
    assert ledger_problems(environment, ledger_defaults()) == []
    assert environment["KVGATE_LEDGER_COMPACT_AFTER_S"] is None


def test_ledger_settings_follow_the_env_file(deploy_tools: DeployTools, env_file: Path, tmp_path: Path) -> None:
    """Every ledger setting is `${VAR:-default}` (or named alone): a line in .env changes it."""
    assert set(LEDGER_SAMPLES) == set(LEDGER_SETTINGS)
    overridden = tmp_path / "env"
    lines = [f"{ledger_env_name(name)}={value}\n" for name, value in LEDGER_SAMPLES.items()]
    overridden.write_text(env_file.read_text() + "".join(lines))
    project = compose_config(deploy_tools, COMPOSE_FILE, overridden)
    assert ledger_problems(project["services"]["kvgate"]["environment"], LEDGER_SAMPLES) == []


def test_compose_policy_templates_are_valid() -> None:
    result = run(kvgate_command("policy", "check", str(COMPOSE_DIR / "policies")))
    assert result.returncode == 0, output(result)


def test_observability_mounts_point_at_the_committed_files(project: dict[str, Any]) -> None:
    services = project["services"]
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            if volume["type"] == "bind":
                assert Path(volume["source"]).exists(), f"{name}: {volume['source']} does not exist"
    prometheus_yml = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    jobs = {job["job_name"]: job for job in prometheus_yml["scrape_configs"]}
    secret = project["secrets"]["kvgate_metrics_key"]
    assert jobs["kvgate"]["authorization"]["credentials_file"] == "/run/secrets/kvgate_metrics_key"
    assert Path(secret["file"]) == COMPOSE_DIR / ".local" / "metrics.key"
    targets = [target for job in jobs.values() for group in job["static_configs"] for target in group["targets"]]
    for target in targets:
        host = target.rsplit(":", 1)[0]
        assert host in services, f"scrape target {target} is not a compose service"
    assert "kvgate:8080" in targets and services["kvgate"]["environment"]["KVGATE_PORT"] == "8080"
    provider = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "dashboards" / "kvgate.yaml").read_text())
    dashboards_mount = next(v for v in services["grafana"]["volumes"]
                            if Path(v["source"]) == DEPLOY / "grafana" / "dashboards")
    assert provider["providers"][0]["options"]["path"] == dashboards_mount["target"]
    datasource = yaml.safe_load((DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert urlsplit(datasource["datasources"][0]["url"]).hostname == "prometheus"


def test_init_script_writes_secrets_and_keyed_policies(tmp_path: Path) -> None:
    shutil.copytree(COMPOSE_DIR / "policies", tmp_path / "policies")
    init = [sys.executable, str(COMPOSE_DIR / "init.py"), "--dir", str(tmp_path)]
    result = run(init)
    assert result.returncode == 0, output(result)
    env = dict(line.split("=", 1) for line in (tmp_path / ".env").read_text().splitlines())
    assert set(env) == set(SECRETS) and all(env.values())
    assert (tmp_path / ".env").stat().st_mode & 0o077 == 0
    policies = tmp_path / ".local" / "policies"
    checked = run(kvgate_command("policy", "check", str(policies)))
    assert checked.returncode == 0, output(checked)
    metrics_key = (tmp_path / ".local" / "metrics.key").read_text().strip()
    ops = yaml.safe_load((policies / "tenants" / "ops.yaml").read_text())
    assert {"sha256": hash_key(metrics_key), "scopes": ["metrics"]} in ops["keys"]
    templates = {path.name: path.read_text() for path in (COMPOSE_DIR / "policies" / "tenants").glob("*.yaml")}
    for name, text in templates.items():
        assert (policies / "tenants" / name).read_text() != text, f"{name} kept its placeholder hashes"
    again = run(init)
    assert again.returncode == 1 and "--force" in again.stderr, "must never rotate keys silently"


def test_dockerfile_copies_only_what_exists() -> None:
    dockerfile = (DEPLOY / "docker" / "Dockerfile").read_text()
    sources = [part for line in dockerfile.splitlines() if line.startswith("COPY ") and "--from" not in line
               for part in line.split()[1:-1]]
    assert sources
    missing = [source for source in sources if not (REPO / source).exists()]
    assert not missing, f"the Dockerfile copies files the repository lacks: {missing}"
    assert 'ENTRYPOINT ["kvgate"]' in dockerfile and "USER 10001" in dockerfile


def test_compose_binary_is_not_the_always_zero_wrapper(deploy_tools: DeployTools, tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text("services:\n  a:\n    image: x\n    depends_on: [nope]\n")
    result = subprocess.run([str(deploy_tools.compose), "-f", str(broken), "config", "-q"], capture_output=True,
                            text=True, check=False, timeout=60)
    assert result.returncode != 0 and "nope" in result.stderr
