"""Alert rules and the Grafana dashboard: well formed, and every metric they query is exported
by the code (or the platform), or the rule says which metric it still needs."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

import pytest
import yaml

from tests.unit.infra.infra_files import INFRA, REPO

RULES = INFRA / "monitoring" / "alerts.rules.yaml"
DASHBOARD = INFRA / "monitoring" / "grafana-dashboard.json"
# Exported by the platform, not by this code: kube-state-metrics, redis_exporter, Ray Serve.
PLATFORM_PREFIXES = ("kube_", "redis_", "ray_serve_")
SEVERITIES = {"page", "ticket", "info"}
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "le", "inf", "nan",
}
SUFFIXES = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count")}


ROUTER_SOURCES = ("scheduler/server/metrics.py", "scheduler/server/app.py", "scheduler/server/config_reload.py",
                  "scheduler/datalayer/carbon/poller.py",
                  "scheduler/datalayer/carbon/metrics.py", "scheduler/datalayer/carbon/http.py",
                  "scheduler/datalayer/carbon/store_io.py")


def router_metrics() -> set[str]:
    """The router's own /metrics names: string literals of its metric-producing modules."""
    names: set[str] = set()
    for source in ROUTER_SOURCES:
        path = REPO / source
        if path.exists():
            names |= set(re.findall(r'"((?:scheduler|carbon)_[a-z_]+)"', path.read_text()))
    return names


def exported_metrics() -> set[str]:
    """The region gateway's ray.util.metrics, as Ray's Prometheus exporter names them, and the
    router's /metrics."""
    tree = ast.parse((REPO / "scheduler" / "serve" / "metrics.py").read_text())
    names: set[str] = router_metrics()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SUFFIXES:
            first = node.args[0]
            assert isinstance(first, ast.Constant) and isinstance(first.value, str)
            names |= {f"ray_{first.value}{suffix}" for suffix in SUFFIXES[node.func.attr]}
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (label matchers, ranges, grouping and functions dropped)."""
    text = re.sub(r'"[^"]*"', "", expr)
    text = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"(?<![A-Za-z0-9_:])\d+(\.\d+)?([eE][-+]?\d+)?", " ", text)
    found = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        following = text[match.end():].lstrip()
        if following.startswith("(") or match.group().lower() in PROMQL_WORDS:
            continue
        found.add(match.group())
    return found


def test_metric_name_extraction() -> None:
    expr = 'sum by (region, le) (rate(a_total{code="UNAVAILABLE"}[5m])) / clamp_min(b, 1e-9) > 0.02 and on(x) c'
    assert metric_names(expr) == {"a_total", "b", "c"}


def test_exported_metrics_come_from_the_code() -> None:
    names = exported_metrics()
    assert {"ray_scheduler_region_requests_total", "ray_scheduler_region_ttft_seconds_bucket",
            "ray_scheduler_region_in_flight"} <= names
    assert {"scheduler_router_requests_total", "scheduler_router_decisions_total",
            "scheduler_carbon_signal_age_seconds", "scheduler_ledger_pending_receipts",
            "carbon_provider_failures_total"} <= names


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def test_rule_file_structure() -> None:
    data = yaml.safe_load(RULES.read_text())
    assert set(data) == {"groups"}
    groups = [g["name"] for g in data["groups"]]
    assert len(groups) == len(set(groups))
    alerts = [r["alert"] for r in _rules()]
    assert len(alerts) == len(set(alerts))
    for rule in _rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert re.fullmatch(r"\d+[smhd]", rule.get("for", "0s")), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


@pytest.mark.parametrize("topic", ["UNAVAILABLE", "Carbon", "Fallback", "Region", "Ledger", "Budget", "Redis",
                                   "scheduler_config_rejected_total"])
def test_the_operators_alerts_exist(topic: str) -> None:
    assert any(topic.lower() in (r["alert"] + r["expr"]).lower() for r in _rules())


@pytest.mark.parametrize("rule", _rules(), ids=lambda r: r["alert"])
def test_rule_metrics_are_exported_or_marked_as_needed(rule: dict[str, Any]) -> None:
    exported = exported_metrics()
    needed = set(rule["labels"].get("needs_metric", "").split())
    for name in metric_names(rule["expr"]):
        known = name in exported or name.startswith(PLATFORM_PREFIXES)
        assert known or name in needed, f"{rule['alert']}: {name} is not exported; add it to needs_metric"
    # Once the code exports a metric, the marker must go (the rule then really fires).
    assert not needed & exported, f"{rule['alert']}: {needed & exported} are exported now; drop needs_metric"
    assert needed <= metric_names(rule["expr"]), f"{rule['alert']}: needs_metric names metrics it does not use"


def test_dashboard_is_valid_grafana_json_on_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    assert any(v["type"] == "datasource" for v in dashboard["templating"]["list"])
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 8
    exported = exported_metrics()
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for target in panel["targets"]:
            for name in metric_names(target["expr"]):
                assert name in exported or name.startswith(PLATFORM_PREFIXES), f"{panel['title']}: {name}"
    queried = {n for p in panels for t in p["targets"] for n in metric_names(t["expr"])}
    assert {"ray_scheduler_region_energy_joules_total", "ray_scheduler_region_errors_total"} <= queried
