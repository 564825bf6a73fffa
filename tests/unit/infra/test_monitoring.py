"""Alert rules (a PrometheusRule) and the three Grafana dashboards: well formed, the committed
dashboards are what infra/monitoring/dashboards.py writes, each dashboard has the panels its
reader needs, and every gateway metric they query is one the region gateway declares. The
router's metric names are checked against a real router's /metrics in
tests/integration/router/test_router_metrics.py."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.infra.infra_files import REPO
from tests.unit.infra.monitoring_files import (
    DASHBOARDS,
    MONITORING,
    PLATFORM_PREFIXES,
    REGION_PREFIX,
    dashboards,
    metric_names,
    queried_metrics,
    router_queried_metrics,
    rule_object,
    rules,
)

pytestmark = pytest.mark.timeout(60)

SEVERITIES = {"page", "ticket", "info"}
SUFFIXES = {"Counter": ("_total",), "Gauge": ("",), "Histogram": ("_bucket", "_sum", "_count")}


def gateway_metrics() -> set[str]:
    """The region gateway's ray.util.metrics, as Ray's Prometheus exporter names them."""
    tree = ast.parse((REPO / "scheduler" / "region" / "metrics.py").read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SUFFIXES:
            first = node.args[0]
            assert isinstance(first, ast.Constant) and isinstance(first.value, str)
            names |= {f"ray_{first.value}{suffix}" for suffix in SUFFIXES[node.func.attr]}
    return names


def test_metric_name_extraction() -> None:
    expr = ('sum by (region, le) (rate(a_total{code="UNAVAILABLE"}[5m])) / clamp_min(b, 1e-9) > 0.02 and on(x) c '
            '* on (region, pool) group_left (gpu) max by (gpu) (d) + increase(e[$__range])')
    assert metric_names(expr) == {"a_total", "b", "c", "d", "e"}


def test_alerts_are_a_prometheus_rule() -> None:
    body = rule_object()
    assert body["apiVersion"] == "monitoring.coreos.com/v1" and body["kind"] == "PrometheusRule"
    assert body["metadata"]["name"] == "scheduler-alerts"
    assert body["metadata"]["labels"]["app.kubernetes.io/part-of"] == "carbon-scheduler"
    assert set(body) == {"apiVersion", "kind", "metadata", "spec"} and set(body["spec"]) == {"groups"}
    groups = [g["name"] for g in body["spec"]["groups"]]
    assert len(groups) == len(set(groups))
    alerts = [r["alert"] for r in rules()]
    assert len(alerts) == len(set(alerts)) >= 20
    for rule in rules():
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert re.fullmatch(r"\d+[smhd]", rule.get("for", "0s")), rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


PROMTOOL = shutil.which("promtool")


def promtool_check(tmp_path: Path, groups: list[dict[str, Any]]) -> None:
    # .ci/run installs Debian's prometheus package (promtool) when it is absent: no skip.
    assert PROMTOOL is not None, "promtool is not installed (apt-get install prometheus)"
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    promtool_check(tmp_path, rule_object()["spec"]["groups"])


def test_promtool_parses_every_panel_query(tmp_path: Path) -> None:
    """Each panel's PromQL as a recording rule, so promtool parses it (Grafana's ``$__range``
    becomes a fixed range first)."""
    groups = [{"name": name, "rules": [
        {"record": f"panel:{name.split('.')[0].replace('-', '_')}:{panel['id']}{target['refId']}",
         "expr": target["expr"].replace("$__range", "1d")}
        for panel in dashboard["panels"] for target in panel["targets"]]}
        for name, dashboard in dashboards().items()]
    promtool_check(tmp_path, groups)


@pytest.mark.parametrize("topic", ["UNAVAILABLE", "Carbon", "Fallback", "Region", "Ledger", "Budget", "Redis",
                                   "scheduler_config_rejected_total", "scheduler_router_ttft_seconds",
                                   "scheduler_router_overhead_seconds", "scheduler_router_failovers_total",
                                   "scheduler_deferred_released_total", "scheduler_carbon_grams_total"])
def test_the_operators_alerts_exist(topic: str) -> None:
    assert any(topic.lower() in (r["alert"] + r["expr"]).lower() for r in rules())


def test_the_kustomization_ships_the_rule_and_the_dashboards() -> None:
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert "alerts.yaml" in kustomization["resources"]
    (dashboards_map,) = kustomization["configMapGenerator"]
    assert dashboards_map["files"] == list(DASHBOARDS)
    assert dashboards_map["options"]["labels"] == {"grafana_dashboard": "1"}


def test_the_committed_dashboards_are_what_the_script_writes() -> None:
    spec = importlib.util.spec_from_file_location("dashboards", MONITORING / "dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["dashboards"] = module  # (its dataclasses look their module up there)
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["dashboards"]
    for name, text in module.render().items():
        assert (MONITORING / name).read_text() == text, f"run python infra/monitoring/dashboards.py ({name})"


@pytest.mark.parametrize("name", DASHBOARDS)
def test_dashboard_is_valid_grafana_json(name: str) -> None:
    dashboard = dashboards()[name]
    assert dashboard["uid"] and dashboard["title"]
    assert any(v["type"] == "datasource" for v in dashboard["templating"]["list"])
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels) >= 10
    for panel in panels:
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]


# What each reader needs: a metric each of these panels must query.
NEEDED = {
    "grafana-operations.json": {
        "live power": "scheduler_pool_power_watts", "power caps": "scheduler_pool_power_cap_watts",
        "capacity": "scheduler_pool_replicas", "queues": "scheduler_pool_queue_depth",
        "KV": "scheduler_pool_kv_cache_usage_ratio", "TTFT SLO": "scheduler_router_ttft_seconds_bucket",
        "availability SLO": "scheduler_router_requests_total", "failovers": "scheduler_router_failovers_total",
        "fallbacks": "scheduler_router_fallbacks_total", "deferral": "scheduler_deferred_released_total",
    },
    "grafana-engineering.json": {
        "model, GPU, precision": "scheduler_pool_info", "energy by precision": "scheduler_energy_joules_total",
        "tokens": "scheduler_tokens_total", "cache hits": "scheduler_pool_prefix_cache_hit_ratio",
        "cache savings": "scheduler_avoided_energy_joules_total",
        "decision time": "scheduler_router_decision_seconds_bucket",
        "router overhead": "scheduler_router_overhead_seconds_bucket",
    },
    "grafana-governance.json": {
        "tenant energy": "scheduler_tenant_energy_joules_total", "tenant carbon": "scheduler_tenant_carbon_grams_total",
        "regional intensity": "scheduler_region_carbon_intensity_g_per_kwh",
        "estimate confidence": "scheduler_receipt_confidence_bucket", "measurement": "scheduler_receipts_total",
        "budgets used": "scheduler_tenant_budget_used", "budget limits": "scheduler_tenant_budget_limit",
        "carbon by basis": "scheduler_carbon_grams_total",
    },
}


@pytest.mark.parametrize("name", DASHBOARDS)
def test_each_dashboard_has_the_panels_its_reader_needs(name: str) -> None:
    queried = {n for p in dashboards()[name]["panels"] for t in p["targets"] for n in metric_names(t["expr"])}
    missing = {need: metric for need, metric in NEEDED[name].items() if metric not in queried}
    assert not missing


def test_gateway_metrics_queried_are_declared_by_the_gateway() -> None:
    declared = gateway_metrics()
    assert {"ray_scheduler_region_requests_total", "ray_scheduler_region_ttft_seconds_bucket",
            "ray_scheduler_region_in_flight"} <= declared
    for name, where in queried_metrics().items():
        if name.startswith(REGION_PREFIX):
            assert name in declared, f"{name} ({sorted(where)}) is not declared in scheduler/region/metrics.py"


def test_every_other_name_is_the_routers_or_the_platforms() -> None:
    names = router_queried_metrics()
    assert names and all(n.startswith(("scheduler_", "carbon_")) for n in names), sorted(names)
    assert not any(n.startswith(PLATFORM_PREFIXES) for n in names)


def test_kustomize_builds_the_rule_and_the_dashboards() -> None:
    """The real kustomize (kubectl's): one PrometheusRule (no rules ConfigMap left) and the
    dashboards' ConfigMap carrying the three JSON files as they are in the tree."""
    from tests.unit.infra.test_kustomize import build

    objects = build(MONITORING)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for body in objects:
        by_kind.setdefault(str(body["kind"]), []).append(body)
    (rule,) = by_kind["PrometheusRule"]
    assert rule["metadata"]["namespace"] == "llm-scheduler"
    assert rule["spec"] == rule_object()["spec"]
    (config_map,) = by_kind["ConfigMap"]
    assert config_map["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert {name: json.loads(text) for name, text in config_map["data"].items()} == dashboards()
