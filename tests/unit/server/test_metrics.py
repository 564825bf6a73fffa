"""The router's metrics on prometheus_client: only declared counters can be counted, a receipt
adds its joules and grams by region, pool and model and by tenant behind the cap, the text
parses as Prometheus exposition, and worker processes sharing a multiprocess directory are
served summed by any of them (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.logformat import JsonFormatter, use_log_format
from scheduler.server.metrics import RouterMetrics
from scheduler.server.tenant_labels import OTHER_TENANTS, TenantLabels
from scheduler.types import EnergyReceipt

pytestmark = pytest.mark.timeout(60)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def receipt(tenant: str, energy_j: float = 120.0, carbon_g: float = 0.5) -> EnergyReceipt:
    return EnergyReceipt(decision_id="d1", request_id="r1", tenant=tenant, model="llama-3.1-8b", region="eu-north",
                         pool="h100-chat", pue=1.1, measurement_source="model", attribution_method="step-v1",
                         energy_j=energy_j, carbon_g=carbon_g, confidence=0.6, prompt_tokens=100,
                         completion_tokens=20, reused_tokens=40, avoided_j=3.0, ttft_ms=150.0, duration_ms=900.0,
                         carbon_basis="signal", precision="fp8")


@pytest.mark.parametrize(("cap", "tenants", "labels"), [
    (2, ["a", "b", "c", "a", "d"], ["a", "b", OTHER_TENANTS, "a", OTHER_TENANTS]),
    (0, ["a", "b"], [OTHER_TENANTS, OTHER_TENANTS]),
    # A tenant literally named "other" never takes a named slot of its own.
    (3, ["other", "x"], [OTHER_TENANTS, "x"]),
], ids=["two named then other", "cap 0: all other", "a tenant called other"])
def test_tenant_labels_are_capped(cap: int, tenants: list[str], labels: list[str]) -> None:
    guard = TenantLabels(cap)
    assert [guard.label(t) for t in tenants] == labels


def test_a_negative_cap_names_the_field() -> None:
    with pytest.raises(ValueError, match="max_tenants: expected an integer >= 0, got -1"):
        TenantLabels(-1)


def test_only_declared_counters_can_be_counted() -> None:
    metrics = RouterMetrics()
    with pytest.raises(KeyError, match="scheduler_made_up_total"):
        metrics.inc("scheduler_made_up_total")


def test_a_receipt_counts_energy_carbon_tokens_and_timings() -> None:
    metrics = RouterMetrics(max_tenants=1)
    metrics.receipt(receipt("acme"))
    metrics.receipt(receipt("globex", energy_j=80.0, carbon_g=0.25))
    metrics.inc("scheduler_deferred_total", {"reason": "carbon"})
    metrics.inc("scheduler_deferred_released_total", {"state": "done"})
    got = samples(metrics.exposition([("scheduler_pool_power_watts", {"region": "eu-north", "pool": "h100-chat"},
                                       650.0)]))
    where = {"region": "eu-north", "pool": "h100-chat", "model": "llama-3.1-8b"}

    def value(name: str, **labels: str) -> float:
        return got[(name, frozenset(labels.items()))]

    assert value("scheduler_energy_joules_total", **where, precision="fp8") == 200.0
    assert value("scheduler_carbon_grams_total", **where, basis="signal") == 0.75
    assert value("scheduler_tenant_energy_joules_total", tenant="acme") == 120.0
    assert value("scheduler_tenant_energy_joules_total", tenant=OTHER_TENANTS) == 80.0
    assert value("scheduler_tokens_total", **where, precision="fp8", kind="reused") == 80.0
    assert value("scheduler_avoided_energy_joules_total", **where) == 6.0
    assert value("scheduler_router_ttft_seconds_count", region="eu-north") == 2.0
    assert value("scheduler_router_ttft_seconds_bucket", region="eu-north", le="0.25") == 2.0
    assert value("scheduler_router_stream_duration_seconds_sum", region="eu-north", end_reason="complete") == 1.8
    assert value("scheduler_receipt_confidence_count", measurement_source="model") == 2.0
    assert value("scheduler_deferred_total", reason="carbon") == 1.0
    assert value("scheduler_deferred_released_total", state="done") == 1.0
    assert value("scheduler_pool_power_watts", region="eu-north", pool="h100-chat") == 650.0


WORKER = """
import sys
from scheduler.server.metrics import RouterMetrics
metrics = RouterMetrics(multiprocess_dir=sys.argv[1])
for _ in range(int(sys.argv[2])):
    metrics.request("/scheduler.v1.GlobalRouter/Generate", "OK")
metrics.decision_seconds.labels("default").observe(0.001)
metrics.active_streams.inc()
if len(sys.argv) > 3:
    print(metrics.exposition([("scheduler_router_energy_routing_enabled", {}, 1.0)]))
"""


def test_workers_sharing_a_multiprocess_directory_are_served_summed(tmp_path: Path) -> None:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}

    def run(*args: str) -> str:
        done = subprocess.run([sys.executable, "-c", WORKER, str(tmp_path), *args], env=env, capture_output=True,
                              text=True, timeout=30, check=True)
        return done.stdout

    run("3")
    run("4")
    got = samples(run("5", "render"))
    assert got[("scheduler_router_requests_total", frozenset({("method", "Generate"), ("code", "OK")}))] == 12.0
    assert got[("scheduler_router_decision_seconds_count", frozenset({("policy", "default")}))] == 3.0
    assert got[("scheduler_router_energy_routing_enabled", frozenset())] == 1.0
    # livesum: the two processes that exited are not alive (their pids are gone), but nothing
    # marked them dead here, so their open streams still count: the supervisor marks them.
    assert got[("scheduler_router_active_streams", frozenset())] == 3.0


def test_json_logs_carry_the_span_of_the_request(capsys: pytest.CaptureFixture[str]) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    span = TracerProvider().get_tracer("test").start_span("request")
    import logging

    record = logging.LogRecord("scheduler.server", logging.WARNING, __file__, 1, "region %s failed", ("eu",), None)
    line = json.loads(JsonFormatter(lambda: span).format(record))
    context = span.get_span_context()
    assert line["message"] == "region eu failed" and line["level"] == "WARNING"
    assert line["trace_id"] == f"{context.trace_id:032x}" and line["span_id"] == f"{context.span_id:016x}"
    # No span current: no ids.
    assert "trace_id" not in json.loads(JsonFormatter().format(record))
    with pytest.raises(ValueError, match="--log-format: expected one of text, json, got 'xml'"):
        use_log_format("xml")


def test_the_router_logs_json_lines() -> None:
    """``scheduler router --log-format json`` (a real process; it stops at the missing ticket keys,
    after its warning about --insecure)."""
    from scheduler.tickets import KEYS_FILE_ENV

    env = {k: v for k, v in os.environ.items() if k != KEYS_FILE_ENV}
    done = subprocess.run([sys.executable, "-m", "scheduler.cli", "router", "--log-format", "json", "--insecure",
                           "--state", "memory"], env=env, capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[3], check=False)
    assert done.returncode == 2, done.stderr
    logged = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    insecure = next(line for line in logged if line["message"].startswith("--insecure: authentication is OFF"))
    assert insecure["level"] == "WARNING" and insecure["logger"] == "scheduler.server.cli"
    assert insecure["time"].endswith("Z") and "trace_id" not in insecure


def test_scrape_time_counters_of_workers_are_summed(tmp_path: Path) -> None:
    """Two workers' own counters (a port's refusals, a poller's polls): whichever answers adds
    the other's last written values; gauges stay its own; a worker gone keeps its counts."""
    from scheduler.server.metrics import SharedScrapeCounters

    first = [("scheduler_http_refused_total", {"port": "http", "reason": "limit"}, 2.0),
             ("scheduler_http_connections", {"port": "http"}, 5.0)]
    second = [("scheduler_http_refused_total", {"port": "http", "reason": "limit"}, 3.0),
              ("carbon_provider_polls_total", {"provider": "csv", "zone": "DE"}, 7.0),
              ("scheduler_http_connections", {"port": "http"}, 1.0)]
    one = SharedScrapeCounters(tmp_path, lambda: first, pid=101)
    two = SharedScrapeCounters(tmp_path, lambda: second, pid=102)
    one.write()
    two.write()
    assert sorted(one.merged(), key=str) == sorted([
        ("scheduler_http_connections", {"port": "http"}, 5.0),
        ("carbon_provider_polls_total", {"provider": "csv", "zone": "DE"}, 7.0),
        ("scheduler_http_refused_total", {"port": "http", "reason": "limit"}, 5.0)], key=str)
    second[0] = ("scheduler_http_refused_total", {"port": "http", "reason": "limit"}, 4.0)
    two.write()
    merged = {(name, tuple(labels.items())): value for name, labels, value in one.merged()}
    assert merged[("scheduler_http_refused_total", (("port", "http"), ("reason", "limit")))] == 6.0
    assert not list(tmp_path.glob("*.tmp"))


def test_fallbacks_are_counted_per_region_they_priced() -> None:
    """A carbon fallback that priced candidates of two regions at a bound counts once for each;
    one that took the whole decision (no candidates named) counts with an empty region."""
    from types import SimpleNamespace

    from scheduler.types import Fallback

    metrics = RouterMetrics()
    bounded = Fallback("carbon", "carbon-scorer", None, 7200.0, key="DE", bound=900.0,
                       candidates=("eu-central/h100", "eu-central/a100", "us-east/h100"))
    whole = Fallback("region_state", "queue-scorer", 400.0, 30.0)
    for _ in range(2):
        metrics.decision(SimpleNamespace(schedulable=True, energy_ranking=True, policy="default",  # type: ignore[arg-type]
                                         fallbacks=(bounded, whole)), 0.001)
    got = samples(metrics.exposition())
    assert got[("scheduler_router_fallbacks_total", frozenset({("signal", "carbon"), ("region", "eu-central")}))] == 2
    assert got[("scheduler_router_fallbacks_total", frozenset({("signal", "carbon"), ("region", "us-east")}))] == 2
    assert got[("scheduler_router_fallbacks_total", frozenset({("signal", "region_state"), ("region", "")}))] == 2
    assert got[("scheduler_router_decisions_total", frozenset({("policy", "default"), ("mode", "energy")}))] == 2
