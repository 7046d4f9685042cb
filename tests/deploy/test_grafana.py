"""The Grafana dashboard: the committed JSON equals a fresh build from code (foundation SDK), every query parses
(promtool), and the layout and variables hold together. test_observability_e2e.py runs every query against
a real Prometheus scraping a running gateway."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.checks import dashboard_exprs, dashboard_problems
from tests.deploy.tools import DEPLOY, DeployTools, output, run

GRAFANA_DIR = DEPLOY / "grafana"
BUILDER = GRAFANA_DIR / "build_dashboard.py"
DASHBOARD = GRAFANA_DIR / "dashboards" / "kvgate.json"
ROWS = ["Traffic and errors", "Time to first token and ΔTTFT", "Prefix cache and offload", "KV blocks and retention",
        "KV-event health", "Protection", "Ledger health", "Offload economics"]
# Families with a tenant label: every query on one of them must honour the $tenant variable.
TENANT_FAMILIES = ("kvgate_requests_total", "kvgate_ttft_seconds", "kvgate_request_duration_seconds",
                   "kvgate_prompt_tokens_total", "kvgate_cached_prompt_tokens_total", "kvgate_shadow_",
                   "kvgate_kv_blocks_", "kvgate_kv_block_lifetime_seconds", "kvgate_retention_violations_total",
                   "kvgate_rate_limited_total", "kvgate_engine_fields_total", "kvgate_offload_admission_total",
                   "kvgate_offload_admission_errors_total", "kvgate_miss_path_total",
                   "kvgate_reuse_trace_requests_total", "kvgate_reuse_trace_sample_rate")
# A family whose children are born at their first event: its panel shows "none" at 0 only while a gateway is scraped.
SCRAPED_FALLBACK = 'label_replace(0 * count(up{job="kvgate"} == 1)'
FALLBACK_FAMILIES = ("kvgate_internal_errors_total", "kvgate_ledger_store_errors_total",
                     "kvgate_ledger_task_restarts_total")


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_committed_json_is_a_fresh_build_and_every_query_parses(deploy_tools: DeployTools, tmp_path: Path) -> None:
    assert dashboard_problems(deploy_tools, BUILDER, DASHBOARD, tmp_path) == []


def test_builder_check_mode(deploy_tools: DeployTools, tmp_path: Path) -> None:
    assert run([deploy_tools.python, BUILDER, "--check"]).returncode == 0
    stale = tmp_path / "kvgate.json"
    stale.write_text("{}\n")
    result = run([deploy_tools.python, BUILDER, "--check", "--output", stale])
    assert result.returncode == 1 and "stale" in result.stderr, output(result)


def test_one_row_per_concern_and_a_sane_grid() -> None:
    panels = dashboard()["panels"]
    assert [panel["title"] for panel in panels if panel["type"] == "row"] == ROWS
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        columns, rows = range(grid["x"], grid["x"] + grid["w"]), range(grid["y"], grid["y"] + grid["h"])
        area = {(x, y) for x in columns for y in rows}
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
            assert panel["fieldConfig"]["defaults"]["unit"], f"{panel['title']} has no unit"
            assert panel["targets"] and panel["description"], panel["title"]


def test_per_tenant_queries_honour_the_tenant_variable() -> None:
    for title, expr in dashboard_exprs(dashboard()):
        selectors = re.findall(r"(kvgate_[a-z_]+)(\{[^}]*\})?", expr)
        for metric, labels in selectors:
            if metric.startswith(TENANT_FAMILIES) and "by (reason)" not in expr and "by (medium)" not in expr:
                assert 'tenant=~"$tenant"' in labels, f"{title}: {metric} ignores $tenant"


def test_variables_and_provisioning_agree() -> None:
    variables = {variable["name"]: variable for variable in dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "tenant", "pool"}
    datasources = yaml.safe_load((GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == variables["datasource"]["query"] == "prometheus"
    assert variables["datasource"]["current"]["value"] == source["uid"]
    for name in ("tenant", "pool"):
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
        assert variables[name]["query"] == f"label_values(kvgate_requests_total, {name})"
    provider = yaml.safe_load((GRAFANA_DIR / "provisioning" / "dashboards" / "kvgate.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"


def test_event_families_without_children_show_none_only_while_scraped() -> None:
    """Panels on families that a healthy gateway never increments carry the gated fallback, and only those."""
    exprs = dashboard_exprs(dashboard())
    for family in FALLBACK_FAMILIES:
        (expr,) = [expr for _, expr in exprs if family in expr]
        assert SCRAPED_FALLBACK in expr and "vector(" not in expr, expr
    others = [expr for _, expr in exprs if not any(family in expr for family in FALLBACK_FAMILIES)]
    assert not [expr for expr in others if SCRAPED_FALLBACK in expr or "vector(" in expr]


def test_alerts_named_by_panels_exist() -> None:
    """A panel's description may point at the alert on its metric; the alert must exist under that name."""
    rules = DEPLOY / "prometheus" / "rules" / "kvgate-alerts.yml"
    alerts = {rule["alert"] for group in yaml.safe_load(rules.read_text())["groups"] for rule in group["rules"]}
    named = {match for panel in dashboard()["panels"]
             for match in re.findall(r"Alert: (\w+)\.", panel.get("description", ""))}
    assert named, "no panel names its alert"
    assert named - alerts == set()
