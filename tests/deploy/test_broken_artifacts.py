"""Every deployment check can fail: each is run on a deliberately broken copy (in a temp dir) of its artifact.
The same check functions pass on the committed artifacts in test_helm/compose/systemd/prometheus/grafana."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.deploy.checks import (
    CHART,
    compose_problems,
    dashboard_problems,
    helm_problems,
    helm_report,
    kubernetes_problems,
    manifests,
    rules_problems,
    systemd_problems,
)
from tests.deploy.tools import DEPLOY, DeployTools, run


def replace_once(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} must occur once in {path}"
    path.write_text(text.replace(old, new))


def test_broken_helm_chart(deploy_tools: DeployTools, tmp_path: Path) -> None:
    unclosed = tmp_path / "unclosed" / "kvgate"
    shutil.copytree(CHART, unclosed)
    replace_once(unclosed / "templates" / "service.yaml", "{{- end }}\nspec:", "\nspec:")
    report = helm_report(deploy_tools, unclosed, {"defaults": {}})
    problems = helm_problems(report["defaults"])
    assert any(problem.startswith("lint error") for problem in problems), problems
    assert any("HelmRenderError" in problem for problem in problems), problems

    # Renders and lints, but the API server would refuse it: only kubernetes-validate catches it.
    mistyped = tmp_path / "mistyped" / "kvgate"
    shutil.copytree(CHART, mistyped)
    replace_once(mistyped / "templates" / "deployment.yaml", "containerPort: 8080", 'containerPort: "8080"')
    case = helm_report(deploy_tools, mistyped, {"defaults": {}})["defaults"]
    assert helm_problems(case) == []
    problems = kubernetes_problems(deploy_tools, manifests(case), tmp_path / "validate")
    assert problems and "is not of type 'integer'" in problems[0]


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("      redis:\n        condition: service_healthy", "      rediss:\n        condition: service_healthy",
     'depends on undefined service "rediss"'),
    ("    read_only: true\n", "    read_only: true\n    readonly: true\n", "readonly"),
])
def test_broken_compose_file(deploy_tools: DeployTools, tmp_path: Path, old: str, new: str, expected: str) -> None:
    compose_dir = tmp_path / "deploy" / "compose"
    shutil.copytree(DEPLOY / "compose", compose_dir, ignore=shutil.ignore_patterns(".env", ".local"))
    replace_once(compose_dir / "compose.yaml", old, new)
    env_file = tmp_path / "env"
    env_file.write_text("KVGATE_SALT_SECRET=a\nVLLM_OFFLOAD_KEY=b\nVLLM_CONTROL_KEY=c\nGRAFANA_ADMIN_PASSWORD=d\n")
    problems = compose_problems(deploy_tools, compose_dir / "compose.yaml", env_file)
    assert problems and expected in "\n".join(problems)


@pytest.mark.parametrize(("old", "new", "expected"), [
    ("ProtectHome=yes", "ProtectHomes=yes", "Unknown key"),
    ("Restart=on-failure", "Restart=sometimes", "Failed to parse"),
])
def test_broken_systemd_unit(tmp_path: Path, old: str, new: str, expected: str) -> None:
    unit = tmp_path / "kvgate.service"
    shutil.copy(DEPLOY / "systemd" / "kvgate.service", unit)
    replace_once(unit, old, new)
    problems = systemd_problems(unit, tmp_path / "root")
    assert problems and expected in problems[0] and "exit 0" in problems[0], "verify exits 0: only stderr tells"


def broken_prometheus_copy(tmp_path: Path, old: str, new: str) -> Path:
    target = tmp_path / "prometheus"
    shutil.copytree(DEPLOY / "prometheus", target)
    replace_once(target / "rules" / "kvgate-alerts.yml", old, new)
    return target


def test_broken_prometheus_rules(tmp_path: Path) -> None:
    unparsable = broken_prometheus_copy(tmp_path / "a", "sum by (reason) (rate(kvgate_auth_failures_total[5m])) > 1",
                                        "sum by (reason) (rate(kvgate_auth_failures_total[5m]) > 1")
    problems = rules_problems(sorted((unparsable / "rules").glob("*.yml")), [])
    assert problems and "parse error" in problems[0]

    # Parses, but no longer does what its unit test says an operator needs: the 5 % threshold became 50 %.
    weakened = broken_prometheus_copy(tmp_path / "b", "          > 0.05\n", "          > 0.5\n")
    problems = rules_problems(sorted((weakened / "rules").glob("*.yml")),
                              sorted((weakened / "tests").glob("*.test.yml")))
    assert len(problems) == 1 and "KvgateUpstreamErrorRate" in problems[0]


def test_broken_dashboard(deploy_tools: DeployTools, tmp_path: Path) -> None:
    grafana = tmp_path / "grafana"
    shutil.copytree(DEPLOY / "grafana", grafana)
    committed = grafana / "dashboards" / "kvgate.json"

    # Hand-edited JSON: no longer what the code builds.
    edited = json.loads(committed.read_text())
    edited["panels"][1]["title"] = "edited by hand"
    committed.write_text(json.dumps(edited, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    problems = dashboard_problems(deploy_tools, grafana / "build_dashboard.py", committed, tmp_path / "a")
    assert len(problems) == 1 and "differs from a fresh build" in problems[0]

    # A query broken in the code, and the JSON rebuilt from it: fresh, but unparsable.
    builder = grafana / "build_dashboard.py"
    gaps = 'q("sum by (source) (kvgate_kv_event_gaps_total)"'
    replace_once(builder, gaps, gaps.replace("total)", "total"))
    rebuilt = tmp_path / "rebuilt.json"
    shutil.copy(committed, rebuilt)
    problems = dashboard_problems(deploy_tools, builder, rebuilt, tmp_path / "b")
    assert any("differs" in problem for problem in problems)
    assert run([deploy_tools.python, builder, "--output", rebuilt]).returncode == 0
    problems = dashboard_problems(deploy_tools, builder, rebuilt, tmp_path / "c")
    assert len(problems) == 1 and "unclosed left parenthesis" in problems[0]
