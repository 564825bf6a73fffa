"""Reading infra/monitoring/: the PrometheusRule, the Grafana dashboards and the metric names
their PromQL queries (for the structure tests here and the check against a real router's
/metrics in tests/integration/router/test_router_metrics.py)."""

from __future__ import annotations

import json
import re
from typing import Any

import yaml

from tests.unit.infra.infra_files import INFRA

MONITORING = INFRA / "monitoring"
RULES = MONITORING / "alerts.yaml"
DASHBOARDS = ("grafana-operations.json", "grafana-engineering.json", "grafana-governance.json")
# Exported by the platform, not by this code: kube-state-metrics, redis_exporter, Ray Serve.
PLATFORM_PREFIXES = ("kube_", "redis_", "ray_serve_")
# Exported by the region gateway through Ray's metrics port (scheduler/region/metrics.py).
REGION_PREFIX = "ray_scheduler_"
PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
    "le", "inf", "nan",
}


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


def rule_object() -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return body


def rules() -> list[dict[str, Any]]:
    return [rule for group in rule_object()["spec"]["groups"] for rule in group["rules"]]


def dashboards() -> dict[str, dict[str, Any]]:
    return {name: json.loads((MONITORING / name).read_text()) for name in DASHBOARDS}


def queried_metrics() -> dict[str, set[str]]:
    """Every metric name a rule or a panel queries -> where (``alert X``, ``file: panel``)."""
    where: dict[str, set[str]] = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            where.setdefault(name, set()).add(f"alert {rule['alert']}")
    for file, dashboard in dashboards().items():
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                for name in metric_names(target["expr"]):
                    where.setdefault(name, set()).add(f"{file}: {panel['title']}")
    return where


def router_queried_metrics() -> dict[str, set[str]]:
    """Those the routers' /metrics must serve (neither the platform's nor the gateways')."""
    return {name: found for name, found in queried_metrics().items()
            if not name.startswith((*PLATFORM_PREFIXES, REGION_PREFIX))}
