"""Each deployment artifact's check, as a function returning its problems (empty = the artifact is good).

The tests run them on the committed artifacts (no problems expected) and on deliberately broken copies
(problems expected), so every check is shown to be able to fail.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_settings import BaseSettings

from gateway.ledger.config import LedgerSettings
from gateway.settings import Settings
from tests.deploy.tools import DEPLOY, DeployTools, output, run, system_tool

CHART = DEPLOY / "helm" / "kvgate"
KUBE_VERSIONS = ("1.25.0", "1.30.0")  # the chart's kubeVersion floor, and the version CI pins
RELEASE, NAMESPACE = "kvgate", "llm"
SYSTEMD_UNIT_DIR = Path("/lib/systemd/system")

# -- Limits ---------------------------------------------------------------------------------------------

# The settings every deployment example (Helm values, compose, systemd env file) carries with kvgate's defaults:
# connection and request limits (docs/limits.md), upstream pool and timeouts, the admission sketch
# (docs/admission.md) and the reuse trace (docs/plan.md).
LIMIT_SETTINGS = ("max_header_bytes", "header_timeout_s", "idle_timeout_s", "body_timeout_s", "max_connections",
                  "max_in_flight", "json_max_depth", "json_max_items", "connect_timeout_s", "read_timeout_s",
                  "upstream_connections", "admission_sketch_width", "reuse_trace", "reuse_block_tokens",
                  "reuse_sample_rate", "reuse_max_roots", "reuse_max_records")

# A value other than the default for each, as the examples' override tests set them.
LIMIT_SAMPLES: dict[str, object] = {
    "max_header_bytes": 32768, "header_timeout_s": 2.5, "idle_timeout_s": 30.0, "body_timeout_s": 120.0,
    "max_connections": 10000, "max_in_flight": 256, "json_max_depth": 32, "json_max_items": 2_000_000,
    "connect_timeout_s": 1.5, "read_timeout_s": 900.0, "upstream_connections": 4096, "admission_sketch_width": 4096,
    "reuse_trace": False, "reuse_block_tokens": 64, "reuse_sample_rate": 0.25, "reuse_max_roots": 5000,
    "reuse_max_records": 1_500_000,
}


# Every ledger setting (gateway/ledger/config.py), read from the model so that a new one cannot be left out of
# the examples unnoticed: each example carries it, with its default, like the limits above.
LEDGER_PREFIX = "KVGATE_LEDGER_"
LEDGER_SETTINGS = tuple(LedgerSettings.model_fields)

# A value other than the default for each. compact_after_s is unset by default (the horizon then follows the
# policies' retention), so the examples name it without a value and this sets it.
LEDGER_SAMPLES: dict[str, object] = {
    "flush_interval_s": 0.5, "spool_events": 400_000, "replay_timeout_s": 3.5, "probe_interval_s": 10.0,
    "lost_after_s": 60.0, "salt_refresh_s": 2.5, "sweep_interval_s": 15.0, "compact_after_s": 1_209_600.0,
    "compact_interval_s": 1800.0, "known_hashes": 3_000_000, "sqlite_busy_timeout_ms": 20_000,
    "user_salts": 250_000, "redis_prefix": "team-a:ledger:",
}


def env_name(setting: str, prefix: str = "KVGATE_") -> str:
    return f"{prefix}{setting.upper()}"


def ledger_env_name(setting: str) -> str:
    return env_name(setting, LEDGER_PREFIX)


def setting_env_names() -> set[str]:
    """Every variable kvgate reads: the process settings and the ledger's."""
    return ({env_name(name) for name in Settings.model_fields}
            | {ledger_env_name(name) for name in LedgerSettings.model_fields})


def limit_defaults() -> dict[str, object]:
    return {name: Settings.model_fields[name].default for name in LIMIT_SETTINGS}


def ledger_defaults() -> dict[str, object]:
    return {name: LedgerSettings.model_fields[name].default for name in LEDGER_SETTINGS}


def limit_problems(env: Mapping[str, str | None], expected: Mapping[str, object]) -> list[str]:
    return setting_problems(Settings, "KVGATE_", env, expected)


def ledger_problems(env: Mapping[str, str | None], expected: Mapping[str, object]) -> list[str]:
    return setting_problems(LedgerSettings, LEDGER_PREFIX, env, expected)


def setting_problems(model: type[BaseSettings], prefix: str, env: Mapping[str, str | None],
                     expected: Mapping[str, object]) -> list[str]:
    """Each expected setting is in `env` (variable name to the string the process gets) and kvgate parses it,
    with its own validation, to the expected value. A setting expected unset (None) must reach the process
    unset: absent, or named with no value (Compose's `NAME:`); an empty string would be refused by kvgate."""
    problems = []
    for name, wanted in expected.items():
        variable = env_name(name, prefix)
        text = env.get(variable)
        if text is None:
            if wanted is not None:
                problems.append(f"{variable} is missing")
            continue
        try:
            parsed = getattr(model.model_validate({name: text}), name)
        except ValidationError as error:
            problems.append(f"{variable}={text!r} is refused by kvgate: {error.errors()[0]['msg']}")
            continue
        if parsed != wanted:
            problems.append(f"{variable}={text!r} is {parsed!r}, expected {wanted!r}")
    return problems


# -- Helm ------------------------------------------------------------------------------------------------


def helm_report(tools: DeployTools, chart: Path, cases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Lint (strict) and render every values case with the Helm SDK."""
    request = {"chart": str(chart), "kube_version": f"v{KUBE_VERSIONS[-1]}",
               "cases": {name: {"values": values, "release": RELEASE, "namespace": NAMESPACE}
                         for name, values in cases.items()}}
    report: dict[str, Any] = tools.script("helm_check.py", request)
    return report


def helm_problems(case: dict[str, Any]) -> list[str]:
    """Lint errors, lint warnings (strict), and a render that failed."""
    problems = [f"lint error: {error}" for error in case["lint"]["errors"]]
    problems += [f"lint: {message['path']}: {message['error']}" for message in case["lint"]["messages"]
                 if message["severity"] >= 2]
    if "error" in case:
        problems.append(f"render {case['error']['type']}: {case['error']['message']}")
    return problems


def manifests(case: dict[str, Any]) -> list[dict[str, Any]]:
    """The Kubernetes objects of one rendered case (NOTES.txt and empty documents left out)."""
    objects: list[dict[str, Any]] = []
    for template, text in sorted(case["manifests"].items()):
        if template.endswith(".yaml"):
            objects += [doc for doc in yaml.safe_load_all(text) if doc]
    return objects


def kubernetes_problems(tools: DeployTools, objects: list[dict[str, Any]], workdir: Path) -> list[str]:
    """kubernetes-validate --strict on every object, for each supported Kubernetes version."""
    workdir.mkdir(parents=True, exist_ok=True)
    files = []
    for index, obj in enumerate(objects):
        path = workdir / f"{index:02d}-{obj['kind']}-{obj['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(obj, sort_keys=False))
        files.append(path)
    problems = []
    for version in KUBE_VERSIONS:
        result = run([tools.kubernetes_validate, "--strict", "--quiet", "-k", version, *files])
        if result.returncode != 0:
            problems.append(f"kubernetes-validate -k {version}:\n{output(result)}")
    return problems


def schema_problems(tools: DeployTools, schema: Path, values_files: list[Path]) -> list[str]:
    result = run([tools.check_jsonschema, "--schemafile", schema, *values_files])
    return [] if result.returncode == 0 else [output(result)]


# -- Docker Compose --------------------------------------------------------------------------------------


def compose_problems(tools: DeployTools, compose_file: Path, env_file: Path) -> list[str]:
    """`docker-compose config -q` through the real binary: schema and semantic errors, any stderr."""
    result = run([tools.compose, "-f", compose_file, "--env-file", env_file, "config", "-q"])
    problems = [] if result.returncode == 0 and not result.stderr.strip() else [output(result)]
    spec = run([tools.check_jsonschema, "--builtin-schema", "vendor.compose-spec", compose_file])
    return problems + ([] if spec.returncode == 0 else [output(spec)])


def compose_config(tools: DeployTools, compose_file: Path, env_file: Path) -> dict[str, Any]:
    """The fully resolved project (interpolated, merged anchors), as Compose itself sees it."""
    result = run([tools.compose, "-f", compose_file, "--env-file", env_file, "config", "--format", "json"])
    if result.returncode != 0:
        raise AssertionError(output(result))
    config: dict[str, Any] = json.loads(result.stdout)
    return config


# -- systemd ---------------------------------------------------------------------------------------------

EXEC_KEYS = ("ExecStart", "ExecStartPre", "ExecStartPost", "ExecReload", "ExecStop", "ExecStopPost")


def unit_entries(unit_text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) for every assignment, in order (systemd allows repeated keys)."""
    entries, section = [], ""
    for raw in unit_text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, value = line.split("=", 1)
            entries.append((section, key.strip(), value.strip()))
    return entries


def exec_paths(unit_text: str) -> list[str]:
    """Absolute executables named by the Exec*= lines (prefixes like `-` or `+` removed)."""
    paths = []
    for _, key, value in unit_entries(unit_text):
        if key in EXEC_KEYS and value:
            paths.append(shlex.split(value)[0].lstrip("-+!@:"))
    return paths


def systemd_root(unit: Path, root: Path) -> Path:
    """A throwaway root holding systemd's own units, the unit under test, stubs for its executables and the
    files it names, so that `systemd-analyze verify --root` judges the unit and nothing else."""
    (root / "lib" / "systemd").mkdir(parents=True)
    shutil.copytree(SYSTEMD_UNIT_DIR, root / "lib" / "systemd" / "system", symlinks=True)
    (root / "etc" / "systemd" / "system").mkdir(parents=True)
    shutil.copy(unit, root / "etc" / "systemd" / "system" / unit.name)
    text = unit.read_text()
    for path in exec_paths(text):
        stub = root / path.lstrip("/")
        stub.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy("/bin/true", stub)
    for _, key, value in unit_entries(text):
        if key == "EnvironmentFile":
            env_file = root / value.lstrip("-").lstrip("/")
            env_file.parent.mkdir(parents=True, exist_ok=True)
            env_file.touch()
        if key in ("ReadOnlyPaths", "ReadWritePaths"):
            for path in value.split():
                (root / path.lstrip("-").lstrip("/")).mkdir(parents=True, exist_ok=True)
    return root


def systemd_problems(unit: Path, root: Path) -> list[str]:
    """`systemd-analyze verify`, failing on any stderr: unknown keys and bad values only warn and exit 0."""
    systemd_root(unit, root)
    result = run([system_tool("systemd-analyze"), "verify", "--man=no", f"--root={root}", unit.name])
    return [] if result.returncode == 0 and not result.stderr.strip() else [output(result)]


# -- Prometheus rules ------------------------------------------------------------------------------------


def rules_problems(rule_files: list[Path], test_files: list[Path]) -> list[str]:
    """`promtool check rules` on the rule files and `promtool test rules` on their unit tests."""
    promtool = system_tool("promtool")
    problems = []
    check = run([promtool, "check", "rules", *rule_files])
    if check.returncode != 0:
        problems.append(output(check))
    if test_files:
        tested = run([promtool, "test", "rules", *test_files])
        if tested.returncode != 0:
            problems.append(output(tested))
    return problems


# -- Grafana ---------------------------------------------------------------------------------------------

GRAFANA_VARIABLES = (("${datasource}", "prometheus"), ("$__rate_interval", "1m"), ("$__interval", "1m"),
                     ("$__range", "1h"), ('"$tenant"', '".*"'), ('"$pool"', '".*"'))


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every query target in the dashboard, rows and collapsed rows included."""
    found = []
    for panel in dashboard.get("panels", []):
        for inner in [panel, *panel.get("panels", [])]:
            for target in inner.get("targets", []):
                found.append((inner.get("title", ""), target["expr"]))
    return found


def exposed_families(exposition: str) -> set[str]:
    """Metric families named by `# TYPE` lines of a text exposition (listed even before their first child), less
    the `_created` companions prometheus_client adds."""
    names = {line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")}
    return {name for name in names if not name.endswith("_created")}


def concrete(expr: str) -> str:
    """A dashboard query with Grafana's variables replaced, as Prometheus would receive it (all tenants)."""
    for variable, value in GRAFANA_VARIABLES:
        expr = expr.replace(variable, value)
    if "$" in re.sub(r"\{\{.*?\}\}", "", expr):
        raise AssertionError(f"unhandled Grafana variable in {expr!r}")
    return expr


def exprs_parse_problems(exprs: list[str], workdir: Path) -> list[str]:
    """Put every expression in a recording rule and let `promtool check rules` parse them all."""
    workdir.mkdir(parents=True, exist_ok=True)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:expr_{index}", "expr": concrete(expr)} for index, expr in enumerate(exprs)]}]}
    path = workdir / "dashboard-exprs.yml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = run([system_tool("promtool"), "check", "rules", path])
    return [] if result.returncode == 0 else [output(result)]


def dashboard_problems(tools: DeployTools, builder: Path, committed: Path, workdir: Path) -> list[str]:
    """The committed JSON must equal a fresh build from code, and every query in it must parse."""
    fresh = run([tools.python, builder, "--stdout"])
    if fresh.returncode != 0:
        return [f"building the dashboard failed:\n{output(fresh)}"]
    problems = []
    if fresh.stdout != committed.read_text():
        problems.append(f"{committed} differs from a fresh build: run `python {builder.name}` and commit the result")
    exprs = [expr for _, expr in dashboard_exprs(json.loads(committed.read_text()))]
    return problems + exprs_parse_problems(exprs, workdir)
