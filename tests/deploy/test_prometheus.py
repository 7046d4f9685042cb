"""Prometheus artifacts: `promtool check config` (with its rule files), `check rules`, `test rules`, and a
unit test for every alert. `promtool check metrics` on a live gateway is in test_observability_e2e.py."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.checks import rules_problems
from tests.deploy.tools import DEPLOY, output, run, system_tool

PROMETHEUS_DIR = DEPLOY / "prometheus"
RULE_FILES = sorted((PROMETHEUS_DIR / "rules").glob("*.yml"))
TEST_FILES = sorted((PROMETHEUS_DIR / "tests").glob("*.test.yml"))
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"


def deployed_config(target: Path) -> Path:
    """The committed prometheus.yml laid out as deploy/compose mounts it, with the metrics-key secret present
    (promtool checks that the credentials file exists); only that one path is moved into the temp dir."""
    shutil.copytree(PROMETHEUS_DIR / "rules", target / "rules")
    config: dict[str, Any] = yaml.safe_load(SCRAPE_CONFIG.read_text())
    key = target / "kvgate_metrics_key"
    key.write_text("kvg_placeholder\n")
    for job in config["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(key)
    path = target / "prometheus.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_check_config_with_its_rule_files(tmp_path: Path) -> None:
    result = run([system_tool("promtool"), "check", "config", deployed_config(tmp_path)])
    assert result.returncode == 0, output(result)
    assert f"SUCCESS: {len(RULE_FILES)} rule files found" in result.stdout, result.stdout
    for path in RULE_FILES:
        assert f"rules/{path.name}" in result.stdout, f"{path.name} is not loaded by prometheus.yml"


def test_rules_parse_and_their_unit_tests_pass() -> None:
    assert RULE_FILES and TEST_FILES
    assert rules_problems(RULE_FILES, TEST_FILES) == []


def rules(kind: str) -> list[dict[str, Any]]:
    found = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            found += [rule for rule in group["rules"] if kind in rule]
    return found


def test_every_alert_has_a_unit_test_that_sees_it_fire() -> None:
    firing: set[str] = set()
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            firing |= {case["alertname"] for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    alerts = {rule["alert"] for rule in rules("alert")}
    assert alerts == firing, f"alerts without a firing test: {alerts - firing}; unknown alerts: {firing - alerts}"


def test_every_alert_is_labelled_and_explained() -> None:
    for rule in rules("alert"):
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]


def test_alerts_watch_the_contract_metrics() -> None:
    text = " ".join(rule["expr"] for rule in rules("alert"))
    for metric in ("kvgate_retention_violations_total", "kvgate_kv_event_gaps_total", "kvgate_shadow_mismatches_total",
                   "kvgate_shadow_ttft_delta_seconds_bucket", "kvgate_auth_failures_total"):
        assert metric in text, metric
    assert re.search(r'kvgate_requests_total\{status=~"5\.\."\}', text)


def test_recording_rule_names_follow_the_convention() -> None:
    for rule in rules("record"):
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", rule["record"]), rule["record"]
