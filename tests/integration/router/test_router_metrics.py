"""A real router's ``/metrics`` (prometheus_client) after real requests on real Redis: the two
deferral counters, joules and gCO2e by region, pool and model and by tenant, the latency
histograms, the fleet and budget gauges; every router metric the alert rules and the three
dashboards query is one this exposition serves (or, for the few that appear only when their
event happens, one the code declares); and a real Prometheus scraping the router evaluates
every rule and panel, each panel on the router's own metrics with data."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from scheduler.client import AsyncSchedulerClient
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon.store_io import write_forecast, write_signal
from scheduler.ledger.budget import TenantBudget
from scheduler.state import codec
from scheduler.state import keys as store_keys
from scheduler.state.redis_store import RedisStore, delete_namespace
from scheduler.types import PoolLiveState, RegionLiveState, Signal
from tests.unit.infra.infra_files import REPO
from tests.unit.infra.monitoring_files import (
    PLATFORM_PREFIXES,
    REGION_PREFIX,
    dashboards,
    metric_names,
    router_queried_metrics,
    rules,
)

from .conftest import Fleet, Keys, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
MODEL = "llama-3.1-8b"
HOUR_S = 3600.0
# Scrape-time samples that exist only once their event happened (a provider failed, a config
# version was refused, a connection was refused ...). Each must still be a name the router's code
# writes (checked below): the rest of the queried names come from the live exposition.
EVENT_ONLY = {
    "carbon_provider_failures_total": "scheduler/datalayer/carbon/metrics.py",
    "carbon_provider_polls_total": "scheduler/datalayer/carbon/metrics.py",
    "scheduler_config_rejected_total": "scheduler/server/config_reload/metrics.py",
}


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-metrics-router-{uuid.uuid4().hex[:12]}"
    yield name
    await delete_namespace(REDIS_URL, name)


@pytest.fixture
def make_router(namespace: str, make_router: RouterFactory) -> RouterFactory:
    """Routers that stop before the namespace is deleted (they book their last entries as they stop)."""
    return make_router


@pytest.fixture
async def store(namespace: str) -> AsyncIterator[RedisStore]:
    opened = RedisStore.from_url(REDIS_URL, namespace)
    yield opened
    await opened.close()


async def publish_fleet(store: RedisStore, regions: tuple[RegionConfig, ...], now: float) -> None:
    """What regions and carbon pollers write: each region's live state (with GPU power) and its
    zone's current intensity and forecast."""
    for region in regions:
        pools = {pool.name: PoolLiveState(queue_depth=2, running=5, kv_cache_usage=0.4, prefix_cache_hit_rate=0.3,
                                          gpu_power_w=600.0, replicas=1) for pool in region.pools}
        state = RegionLiveState(region.name, healthy=True, observed_at=now, pools=pools)
        await store.set(store_keys.region_state(region.name), codec.encode_region_state(state), ttl_s=60)
    hour = math.floor(now / HOUR_S) * HOUR_S
    for zone in {r.carbon.zone for r in regions}:
        await write_signal(store, Signal("carbon_intensity", zone, 300.0, "gCO2eq/kWh", now - 60, now, "test"))
        await write_forecast(store, zone, [Signal("carbon_intensity", zone, 300.0, "gCO2eq/kWh", hour + k * HOUR_S,
                                                  now, "test", is_forecast=True) for k in range(8)])


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples whose labels include ``labels``."""
    wanted = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and wanted <= lab)


async def test_metrics_after_real_requests(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str,
) -> None:
    now = time.time()
    await publish_fleet(store, stub_fleet.configs, now)
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               metrics_port=0, budgets={"acme": TenantBudget(soft_energy_j=1e7, hard_energy_j=1e8)})
    assert router.metrics_endpoint is not None
    url = f"http://127.0.0.1:{router.metrics_endpoint.port}/metrics"
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
        generation = client.generate("Explain PUE in one line.", model=MODEL, max_tokens=4)
        assert await generation.text()
        receipt = generation.receipt
        assert receipt is not None and receipt.energy_j > 0 and receipt.carbon_g > 0
        # A chain step is never held: deferred and released at once, then done.
        chain = await client.defer("step 2 of the plan", model=MODEL, max_tokens=4, workflow_id="plan-7",
                                   workflow_shape="chain", deadline_unix_s=now + 6 * HOUR_S)
        assert chain.reason == "chain"
        await client.wait_deferred(chain.request_id, timeout_s=30)

    async with httpx.AsyncClient() as http:
        deadline = time.monotonic() + 20
        while True:
            answer = await http.get(url)
            assert answer.status_code == 200
            samples = parse(answer.text)
            released = total(samples, "scheduler_deferred_released_total", state="done")
            if (released >= 1 and total(samples, "scheduler_pool_power_watts") > 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
    assert answer.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert total(samples, "scheduler_deferred_total", reason="chain") == 1
    assert released == 1
    where = {"region": receipt.region, "pool": receipt.pool, "model": MODEL}
    # Both streams (the Generate and the released chain step) are billed.
    assert total(samples, "scheduler_energy_joules_total", **where) >= receipt.energy_j > 0
    assert total(samples, "scheduler_carbon_grams_total", **where, basis="signal") >= receipt.carbon_g > 0
    assert total(samples, "scheduler_tenant_energy_joules_total", tenant="acme") >= receipt.energy_j
    assert total(samples, "scheduler_tenant_carbon_grams_total", tenant="acme") >= receipt.carbon_g
    assert total(samples, "scheduler_tokens_total", **where, kind="completion") >= 4
    assert total(samples, "scheduler_router_requests_total", method="Generate", code="OK") == 1
    assert total(samples, "scheduler_router_decision_seconds_count") >= 2
    assert total(samples, "scheduler_router_overhead_seconds_count", mode="proxy") >= 2
    assert total(samples, "scheduler_router_ttft_seconds_count", region=receipt.region) >= 1
    assert total(samples, "scheduler_router_stream_duration_seconds_count", end_reason="complete") >= 2
    assert total(samples, "scheduler_receipts_total") >= 2
    assert total(samples, "scheduler_router_active_streams") == 0
    assert total(samples, "scheduler_pool_power_watts", region=receipt.region) == 600.0 * len(
        next(r for r in stub_fleet.configs if r.name == receipt.region).pools)
    assert total(samples, "scheduler_region_carbon_intensity_g_per_kwh", region=receipt.region) == 300.0
    assert total(samples, "scheduler_tenant_budget_limit", tenant="acme", kind="energy_j", level="hard") == 1e8

    # Every router metric a rule or a panel queries: served here, or written only on its event.
    text = answer.text
    families = [family.name for family in text_string_to_metric_families(text)]
    assert len(families) == len(set(families)), "a metric family is written twice"
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    # (declared counters and histograms are listed with no sample until counted)
    served = {name for (name, _labels) in samples} | {
        family.name + suffix for family in text_string_to_metric_families(text)
        for suffix in suffixes.get(family.type, ())}
    missing = {name: sorted(where) for name, where in router_queried_metrics().items()
               if name not in served and name not in EVENT_ONLY}
    assert not missing
    for name, source in EVENT_ONLY.items():
        assert f'"{name}"' in (REPO / source).read_text(), f"{name} is not written by {source}"


async def test_a_failover_is_counted_by_region_and_logged_with_the_trace_id(
    stub_fleet: Fleet, make_router: RouterFactory,
) -> None:
    """``--log-format json``'s formatter, given the router's current span: the failover warning
    of a traced call carries the caller's trace id; the failover is counted against its region."""
    from opentelemetry.sdk.trace import TracerProvider

    from scheduler.client.common import build_request
    from scheduler.logformat import JsonFormatter
    from scheduler.server.edge import current_span
    from scheduler.server.tracing import RouterTracing
    from scheduler.v1 import router_pb2_grpc

    lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Capture()
    handler.setFormatter(JsonFormatter(current_span))
    dispatch_log = logging.getLogger("scheduler.server.dispatch")
    dispatch_log.addHandler(handler)
    router = await make_router(stub_fleet.configs, tracing=RouterTracing(TracerProvider()))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
            decision = await client.route("hello", model=MODEL, max_tokens=4, jurisdictions=["EU"])
        first = decision.ranked[0].region
        stub_fleet.regions[first].settings.fail_status = 503
        async with grpc.aio.insecure_channel(f"127.0.0.1:{router.port}") as channel:
            call = router_pb2_grpc.GlobalRouterStub(channel).Generate(
                build_request(prompt="hello", model=MODEL, max_tokens=4, jurisdictions=["EU"]),
                metadata=(("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),))
            assert [answer async for answer in call]
    finally:
        dispatch_log.removeHandler(handler)
    assert router.deps.metrics.value("scheduler_router_failovers_total", {"region": first}) == 1
    (failover,) = [json.loads(line) for line in lines if "failover" in line]
    assert failover["level"] == "WARNING" and failover["logger"] == "scheduler.server.dispatch"
    assert failover["trace_id"] == trace_id and len(failover["span_id"]) == 16


# Router counters that have no series until their event happens (a failover, a fallback, a
# refusal): a panel on them is empty on a healthy fleet, and that is right.
EVENT_COUNTERS = {"scheduler_router_failovers_total", "scheduler_router_fallbacks_total",
                  "scheduler_budget_rejections_total"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_real_prometheus_evaluates_every_panel_and_rule(
    stub_fleet: Fleet, make_router: RouterFactory, keys: Keys, store: RedisStore, namespace: str, tmp_path: Path,
) -> None:
    """A real Prometheus scrapes a real router every second while it serves: every rule and
    panel query evaluates, and every panel on the router's own metrics has data (the gateway's,
    the platform's and the event counters' have no source here)."""
    prometheus = shutil.which("prometheus")
    # .ci/run installs Debian's prometheus package (promtool and prometheus) when it is absent.
    assert prometheus is not None, "prometheus is not installed (apt-get install prometheus)"
    await publish_fleet(store, stub_fleet.configs, time.time())
    router = await make_router(stub_fleet.configs, keys=keys.ring, store=RedisStore.from_url(REDIS_URL, namespace),
                               metrics_port=0, budgets={"acme": TenantBudget(soft_energy_j=1e3, hard_energy_j=1e8)})
    assert router.metrics_endpoint is not None
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "router", "static_configs": [
            {"targets": [f"127.0.0.1:{router.metrics_endpoint.port}"]}]}]}))
    server = subprocess.Popen([prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                               f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=keys.tenant.key) as client:
            for step in range(10):  # rate() needs two scrapes apart
                assert await client.generate("Explain PUE in one line.", model=MODEL, max_tokens=4).text()
                if step == 2:
                    await client.defer("step 2 of the plan", model=MODEL, max_tokens=4, workflow_id="plan-7",
                                       workflow_shape="chain", deadline_unix_s=time.time() + 6 * HOUR_S)
                await publish_fleet(store, stub_fleet.configs, time.time())
                await asyncio.sleep(1.0)
        await asyncio.sleep(2.5)
        queries = [(f"alert {rule['alert']}", rule["expr"], False) for rule in rules()]
        for file, dashboard in dashboards().items():
            for panel in dashboard["panels"]:
                for target in panel["targets"]:
                    names = metric_names(target["expr"])
                    ours = not any(n.startswith((*PLATFORM_PREFIXES, REGION_PREFIX)) or n in EVENT_COUNTERS
                                   for n in names)
                    queries.append((f"{file}: {panel['title']} {target['refId']}",
                                    target["expr"].replace("$__range", "5m"), ours))
        failed, empty = [], []
        async with httpx.AsyncClient() as http:
            for where, expr, needs_data in queries:
                answer = (await http.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr})).json()
                if answer["status"] != "success":
                    failed.append((where, answer.get("error")))
                elif needs_data and not answer["data"]["result"]:
                    empty.append(where)
    finally:
        server.terminate()
        server.wait(10)
    assert not failed
    assert not empty
    assert sum(needs_data for _, _, needs_data in queries) >= 40  # most panels are the router's own
