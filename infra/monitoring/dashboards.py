"""The three Grafana dashboards, written as JSON next to this file:

  grafana-operations.json   the operator: live power against the caps, capacity, queues, SLOs,
                            failovers and fallbacks, the deferral queue, the routers and Redis
  grafana-engineering.json  the engineer: models, GPUs and precisions (the kernels they run), energy
                            per token, prefix-cache hits, decision and router time
  grafana-governance.json   the governance lead: each tenant's share of energy and carbon, regional
                            grid intensity, how sure the estimates are, monthly budgets

    python infra/monitoring/dashboards.py           # write them
    python infra/monitoring/dashboards.py --check   # exit 1 when a file differs from what this writes

Every query names metrics the router (scheduler/server/metrics.py and the gauges of its /metrics)
or the region gateway (scheduler/region/metrics.py, ``ray_`` prefixed by Ray) exports, or the
platform's (kube-state-metrics, redis_exporter, Ray Serve); tests/unit/infra/test_monitoring.py
checks each name against a real router's /metrics. Several router replicas each serve the same
fleet gauges (they read one store): panels take ``max by`` of those and ``sum`` of counters.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    title: str
    queries: Sequence[Query]
    unit: str = "short"
    kind: str = "timeseries"
    description: str = ""
    width: int = 12
    options: dict[str, Any] = field(default_factory=dict)


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


def dashboard(uid: str, title: str, description: str, panels: Sequence[Panel]) -> dict[str, Any]:
    laid_out: list[dict[str, Any]] = []
    x = y = 0
    for number, panel in enumerate(panels, start=1):
        if x + panel.width > WIDTH:
            x, y = 0, y + 8
        laid_out.append({
            "id": number,
            "type": panel.kind,
            "title": panel.title,
            "description": panel.description,
            "datasource": DATASOURCE,
            "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
            "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
            "options": panel.options or ({"legend": {"displayMode": "list", "placement": "bottom"},
                                          "tooltip": {"mode": "multi"}} if panel.kind == "timeseries" else {}),
            "targets": [{"refId": chr(ord("A") + i), "expr": query.expr, "legendFormat": query.legend,
                         "datasource": DATASOURCE, **({"format": "table", "instant": True}
                                                      if panel.kind == "table" else {})}
                        for i, query in enumerate(panel.queries)],
        })
        x += panel.width
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["carbon-scheduler", "llm"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus", "current": {}}]},
        "annotations": {"list": []},
        "panels": laid_out,
    }


def _quantiles(metric: str, by: str, window: str = "5m") -> list[Query]:
    return [q(f"histogram_quantile({quantile}, sum by ({by}, le) (rate({metric}_bucket[{window}])))",
              f"p{round(quantile * 100)} {{{{{by.split(',')[0]}}}}}") for quantile in (0.5, 0.99)]


def operations() -> dict[str, Any]:
    panels = [
        Panel("GPU power drawn by region", [
            q("sum by (region) (max by (region, pool) (scheduler_pool_power_watts))", "{{region}}")], "watt",
            description="What each region's pools publish (NVML), as the routers last read it."),
        Panel("Power drawn / power cap", [
            q("sum by (region) (max by (region, pool) (scheduler_pool_power_watts)) / "
              "clamp_min(sum by (region) (max by (region, pool) (scheduler_pool_power_cap_watts)), 1)", "{{region}}")],
            "percentunit"),
        Panel("Power billed to requests (J/s)", [
            q("sum by (region) (rate(scheduler_energy_joules_total[5m]))", "{{region}} receipts"),
            q("sum by (region) (rate(ray_scheduler_region_idle_energy_joules_total[5m]))", "{{region}} idle")],
            "watt"),
        Panel("Replicas up / GPUs", [
            q("max by (region, pool) (scheduler_pool_replicas)", "{{region}}/{{pool}} replicas"),
            q("max by (region, pool) (scheduler_pool_gpus)", "{{region}}/{{pool}} GPUs")]),
        Panel("Queue depth and running requests", [
            q("max by (region, pool) (scheduler_pool_queue_depth)", "{{region}}/{{pool}} queued"),
            q("max by (region, pool) (scheduler_pool_running_requests)", "{{region}}/{{pool}} running")]),
        Panel("KV cache in use", [
            q("max by (region, pool) (scheduler_pool_kv_cache_usage_ratio)", "{{region}}/{{pool}}")], "percentunit"),
        Panel("Open streams: routers and gateways", [
            q("sum(scheduler_router_active_streams)", "routers"),
            q("sum by (region) (ray_scheduler_region_in_flight)", "{{region}} gateway")]),
        Panel("Deferral queue", [
            q("sum by (reason) (rate(scheduler_deferred_total[15m]))", "held: {{reason}}"),
            q("sum by (state) (rate(scheduler_deferred_released_total[15m]))", "released: {{state}}"),
            q("sum(scheduler_deferred_running)", "running now")]),
        Panel("Time to first token (router)", _quantiles("scheduler_router_ttft_seconds", "region"), "s"),
        Panel("Time to first token (gateway)", _quantiles("ray_scheduler_region_ttft_seconds", "region"), "s"),
        Panel("Availability (calls not UNAVAILABLE)", [
            q('1 - (sum(rate(scheduler_router_requests_total{code="UNAVAILABLE"}[5m])) or vector(0)) / '
              "clamp_min(sum(rate(scheduler_router_requests_total[5m])), 1e-9)", "availability")], "percentunit",
            description="(or vector(0): no UNAVAILABLE yet is 100 %, not an empty panel)"),
        Panel("Router calls by code", [
            q("sum by (code) (rate(scheduler_router_requests_total[5m]))", "{{code}}")], "reqps"),
        Panel("Failovers by region", [
            q("sum by (region) (rate(scheduler_router_failovers_total[5m]))", "{{region}}")], "ops"),
        Panel("Fallbacks by signal and region", [
            q("sum by (signal, region) (rate(scheduler_router_fallbacks_total[5m]))", "{{signal}} {{region}}")],
            "ops"),
        Panel("Region health as the routers see it", [
            q("min by (region) (scheduler_router_region_healthy)", "{{region}}")]),
        Panel("Region error ratio (gateway)", [
            q("sum by (region) (rate(ray_scheduler_region_errors_total[5m])) / "
              "clamp_min(sum by (region) (rate(ray_scheduler_region_requests_total[5m])) + "
              "sum by (region) (rate(ray_scheduler_region_errors_total[5m])), 1e-9)", "{{region}}")], "percentunit"),
        Panel("Stream duration", _quantiles("scheduler_router_stream_duration_seconds", "region"), "s"),
        Panel("Router replicas available", [
            q('kube_deployment_status_replicas_available{deployment="scheduler-router"}', "available")]),
        Panel("Redis memory used / max", [
            q("redis_memory_used_bytes / clamp_min(redis_memory_max_bytes, 1)", "{{instance}}")], "percentunit"),
        Panel("Ledger receipts waiting in the routers", [
            q("sum(scheduler_ledger_pending_receipts)", "pending")]),
    ]
    return dashboard("carbon-scheduler-ops", "Carbon-aware LLM router: operations",
                     "Live power against the caps, capacity, queues and SLOs of every region; the routers' "
                     "availability, failovers, fallbacks and deferral queue; Redis.", panels)


def engineering() -> dict[str, Any]:
    per_token = ("sum by ({by}) (rate(scheduler_energy_joules_total[15m])) / "
                 'clamp_min(sum by ({by}) (rate(scheduler_tokens_total{{kind="completion"}}[15m])), 1e-9)')
    panels = [
        Panel("Pools: GPU, model, precision", [
            q("max by (region, pool, gpu, model, precision, tensor_parallel) (scheduler_pool_info)")],
            kind="table", width=24),
        Panel("Energy per generated token by model", [q(per_token.format(by="model"), "{{model}}")], "J"),
        Panel("Energy per generated token by GPU and precision", [
            q("sum by (gpu, precision) (rate(scheduler_energy_joules_total[15m]) * on (region, pool, model, "
              "precision) group_left (gpu) max by (region, pool, model, precision, gpu) (scheduler_pool_info)) / "
              'clamp_min(sum by (gpu, precision) (rate(scheduler_tokens_total{kind="completion"}[15m]) * on '
              "(region, pool, model, precision) group_left (gpu) max by (region, pool, model, precision, gpu) "
              "(scheduler_pool_info)), 1e-9)", "{{gpu}} {{precision}}")], "J",
            description="The kernels a pool runs follow from its GPU and the weights' precision "
                        "(FP8: weight-only W8A16 kernels; docs/energy-model.md)."),
        Panel("Energy by precision", [
            q("sum by (precision) (rate(scheduler_energy_joules_total[15m]))", "{{precision}}")], "watt"),
        Panel("Generated tokens/s by model and precision", [
            q('sum by (model, precision) (rate(scheduler_tokens_total{kind="completion"}[5m]))',
              "{{model}} {{precision}}")]),
        Panel("Prefix-cache hits (reused / prompt tokens)", [
            q('sum by (region, pool) (rate(scheduler_tokens_total{kind="reused"}[15m])) / '
              'clamp_min(sum by (region, pool) (rate(scheduler_tokens_total{kind="prompt"}[15m])), 1e-9)',
              "{{region}}/{{pool}} receipts"),
            q("max by (region, pool) (scheduler_pool_prefix_cache_hit_ratio)", "{{region}}/{{pool}} engine")],
            "percentunit"),
        Panel("Prefix-cache reuse at the gateway (cached / prompt tokens)", [
            q("sum by (region) (rate(ray_scheduler_region_cached_tokens_total[15m])) / "
              "clamp_min(sum by (region) (rate(ray_scheduler_region_prompt_tokens_total[15m])), 1e-9)",
              "{{region}}")], "percentunit"),
        Panel("Prefill energy saved by the prefix cache", [
            q("sum by (region, pool) (rate(scheduler_avoided_energy_joules_total[15m]))", "{{region}}/{{pool}}")],
            "watt"),
        Panel("Energy per token at the gateway", [
            q("sum by (region) (rate(ray_scheduler_region_energy_joules_total[15m])) / "
              "clamp_min(sum by (region) (rate(ray_scheduler_region_completion_tokens_total[15m])), 1e-9)",
              "{{region}}")], "J"),
        Panel("Idle GPU energy by pool", [
            q("sum by (region, pool) (rate(ray_scheduler_region_idle_energy_joules_total[15m]))",
              "{{region}}/{{pool}}")], "watt"),
        Panel("Decision time", _quantiles("scheduler_router_decision_seconds", "policy"), "s"),
        Panel("Router overhead", _quantiles("scheduler_router_overhead_seconds", "mode"), "s",
              description="proxy: from the call to its dispatch; route: the whole Route call."),
        Panel("Decisions by ranking mode", [
            q("sum by (mode) (rate(scheduler_router_decisions_total[5m]))", "{{mode}}")], "ops"),
        Panel("Healthy Serve replicas", [
            q("sum by (application, deployment) (ray_serve_deployment_replica_healthy)",
              "{{application}}/{{deployment}}")]),
    ]
    return dashboard("carbon-scheduler-engineering", "Carbon-aware LLM router: models, hardware, caches",
                     "Energy per token by model, GPU and precision; prefix-cache hits and the energy they save; "
                     "decision time and the router's own overhead.", panels)


def governance() -> dict[str, Any]:
    budget_share = ("max by (tenant, kind) (scheduler_tenant_budget_used) / on (tenant, kind) "
                    'max by (tenant, kind) (scheduler_tenant_budget_limit{{level="{level}"}})')
    panels = [
        Panel("Energy share by tenant (range)", [
            q("sum by (tenant) (increase(scheduler_tenant_energy_joules_total[$__range]))", "{{tenant}}")], "J",
            kind="piechart", options={"legend": {"displayMode": "table", "placement": "right"}},
            description="Tenants past the router's --metrics-max-tenants are counted as 'other'."),
        Panel("Carbon share by tenant (range)", [
            q("sum by (tenant) (increase(scheduler_tenant_carbon_grams_total[$__range]))", "{{tenant}}")],
            "massg", kind="piechart", options={"legend": {"displayMode": "table", "placement": "right"}}),
        Panel("Grid carbon intensity by region", [
            q("max by (region, zone) (scheduler_region_carbon_intensity_g_per_kwh)", "{{region}} ({{zone}})")]),
        Panel("Carbon intensity of the energy served (with PUE)", [
            q("sum by (region) (rate(scheduler_carbon_grams_total[1h])) / "
              "clamp_min(sum by (region) (rate(scheduler_energy_joules_total[1h])), 1e-9) * 3.6e6", "{{region}}")],
            description="gCO2e per kWh billed: the grid's intensity times the region's PUE, as receipts priced it."),
        Panel("Carbon by region (g/h)", [
            q("sum by (region) (rate(scheduler_carbon_grams_total[1h])) * 3600", "{{region}}")], "massg"),
        Panel("Carbon priced at an upper bound (share)", [
            q('(sum(rate(scheduler_carbon_grams_total{basis="upper-bound"}[1h])) or vector(0)) / '
              "clamp_min(sum(rate(scheduler_carbon_grams_total[1h])), 1e-9)", "upper bound")], "percentunit",
            description="Grams billed while the zone's signal was stale or missing: a conservative bound, "
                        "not a measurement (docs/objective.md)."),
        Panel("Receipts by measurement source", [
            q("sum by (measurement_source) (rate(scheduler_receipts_total[1h]))", "{{measurement_source}}")], "ops"),
        Panel("Estimate confidence (median)", [
            q("histogram_quantile(0.5, sum by (measurement_source, le) (rate(scheduler_receipt_confidence_bucket[1h])))",
              "{{measurement_source}}")], "percentunit"),
        Panel("Carbon signal age by zone", [
            q("max by (zone) (scheduler_carbon_signal_age_seconds)", "{{zone}}")], "s"),
        Panel("Monthly budget used (of the hard limit)", [
            q(budget_share.format(level="hard"), "{{tenant}} {{kind}}")], "percentunit"),
        Panel("Monthly budget used (of the soft limit)", [
            q(budget_share.format(level="soft"), "{{tenant}} {{kind}}")], "percentunit"),
        Panel("Requests refused by a hard budget", [
            q("sum by (tenant) (increase(scheduler_budget_rejections_total[1h]))", "{{tenant}}")]),
        Panel("Work deferred to a cleaner hour", [
            q("sum by (reason) (increase(scheduler_deferred_total[1d]))", "{{reason}}")]),
        Panel("Decisions on the fallback (performance) order", [
            q('(sum(rate(scheduler_router_decisions_total{mode="fallback"}[1h])) or vector(0)) / '
              "clamp_min(sum(rate(scheduler_router_decisions_total[1h])), 1e-9)", "fallback")], "percentunit"),
    ]
    return dashboard("carbon-scheduler-governance", "Carbon-aware LLM router: tenants, carbon, budgets",
                     "Each tenant's share of energy and carbon, regional grid intensity, how the receipts were "
                     "measured and how sure they are, and the monthly budgets.", panels)


DASHBOARDS = {"grafana-operations.json": operations, "grafana-engineering.json": engineering,
              "grafana-governance.json": governance}


def render() -> dict[str, str]:
    return {name: json.dumps(build(), indent=2) + "\n" for name, build in DASHBOARDS.items()}


def main(argv: Sequence[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in render().items():
        path = HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    for name in stale:
        print(f"infra/monitoring/{name} differs from infra/monitoring/dashboards.py: run it", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
