"""The router's Prometheus metrics (``prometheus_client``) and the plaintext HTTP endpoint for them.

Counted as they happen (``RouterMetrics``; every name below, and only these, can be counted:
``inc`` with any other name raises):
  scheduler_router_requests_total{method, code}      every call, by its final gRPC status
  scheduler_router_decisions_total{policy, mode}     mode: energy | fallback | unschedulable
  scheduler_router_fallbacks_total{signal, region}   each fallback a decision took, per region it
                                                      priced at a bound ("" : the whole decision)
  scheduler_router_failovers_total{region}           regions that failed before the first token
  scheduler_budget_rejections_total{tenant}          Generate calls refused by a hard budget
  scheduler_deferred_total{reason}, scheduler_deferred_released_total{state},
  scheduler_deferred_refused_total{cap}, scheduler_deferred_cancelled_total{was}   the deferral queue
  scheduler_energy_joules_total{region, pool, model, precision}    energy of booked receipts (J)
  scheduler_carbon_grams_total{region, pool, model, basis}         their carbon (gCO2e); basis:
                                                      signal | upper-bound (docs/objective.md)
  scheduler_avoided_energy_joules_total{region, pool, model}       prefill saved by prefix caches
  scheduler_tokens_total{region, pool, model, precision, kind}     kind: prompt | completion | reused
  scheduler_receipts_total{region, measurement_source, end_reason}
  scheduler_tenant_energy_joules_total{tenant}, scheduler_tenant_carbon_grams_total{tenant}
Histograms:
  scheduler_router_decision_seconds{policy}          one Scheduler.schedule call
  scheduler_router_overhead_seconds{mode}            proxy: arrival to dispatch; route: the whole call
  scheduler_router_ttft_seconds{region}              time to first token, as the receipt says
  scheduler_router_stream_duration_seconds{region, end_reason}
  scheduler_receipt_confidence{measurement_source}   the receipts' confidence (0..1)
Gauges read at scrape time (``Sample`` triples from the router's parts: its snapshot, the
ledger, the carbon pollers, the config reloader, the ports, ...; ``fleet_samples``).

Tenant labels go through ``TenantLabels`` (scheduler.server.tenant_labels): the first
``max_tenants`` tenants a process sees keep their name, the rest are counted as ``other`` (the
router's ``--metrics-max-tenants``).

Several worker processes (``scheduler router --workers N``) share one directory of counter
files (prometheus_client's multiprocess mode, ``PROMETHEUS_MULTIPROC_DIR``, made and removed
by the parent, scheduler.server.workers): every worker's ``/metrics`` serves the counters and
histograms of all of them, summed; the counters its parts report at scrape time summed too
(``SharedScrapeCounters``: written every second); and its own scrape-time gauges.

``MetricsEndpoint`` serves ``GET /metrics`` (Prometheus text format 0.0.4) and ``GET /healthz``
(200 while the gRPC health status is SERVING, else 503) on a separate plaintext port, so
that probes and scrapers need no TLS client certificate. It runs on the router's HTTP server
(scheduler.http.server) with limits for a port only scrapers and probes use
(``METRICS_LIMITS``: a few connections per address, no bodies, the same timeouts).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from scheduler.http.server import HttpRequest, HttpResponse, HttpServer, ServerLimits, ServerStats
from scheduler.server.tenant_labels import DEFAULT_MAX_TENANT_LABELS, TenantLabels
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.types import Decision, EnergyReceipt, FleetSnapshot

log = logging.getLogger(__name__)

Sample = tuple[str, Mapping[str, str], float]

# (name with its _total, help, label names): the counters callers add to by name.
COUNTERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("scheduler_router_requests_total", "Router calls by method and final gRPC status code.", ("method", "code")),
    ("scheduler_router_decisions_total", "Routing decisions by policy and ranking mode.", ("policy", "mode")),
    ("scheduler_router_fallbacks_total", "Fallbacks taken by decisions, by signal and the region priced at a bound.",
     ("signal", "region")),
    ("scheduler_router_failovers_total", "Regions that failed before the first token.", ("region",)),
    ("scheduler_budget_rejections_total", "Generate calls refused by a tenant's hard budget.", ("tenant",)),
    ("scheduler_deferred_total", "Requests the deferral queue held, by why.", ("reason",)),
    ("scheduler_deferred_released_total", "Deferred requests released, by how they ended.", ("state",)),
    ("scheduler_deferred_refused_total", "Deferrals refused by a cap of the queue.", ("cap",)),
    ("scheduler_deferred_cancelled_total", "Deferred requests cancelled, by the state they were in.", ("was",)),
    ("scheduler_energy_joules_total", "Energy of booked receipts (J).", ("region", "pool", "model", "precision")),
    ("scheduler_carbon_grams_total", "Carbon of booked receipts (gCO2e), by whether a grid signal or a bound priced it.",
     ("region", "pool", "model", "basis")),
    ("scheduler_avoided_energy_joules_total", "Prefill energy the prefix cache saved (J).", ("region", "pool", "model")),
    ("scheduler_tokens_total", "Tokens of booked receipts: prompt, completion, and prompt tokens reused from a cache.",
     ("region", "pool", "model", "precision", "kind")),
    ("scheduler_receipts_total", "Booked receipts by how their energy was measured and how the stream ended.",
     ("region", "measurement_source", "end_reason")),
    ("scheduler_tenant_energy_joules_total", "Energy of booked receipts by tenant (J; past the cap: other).",
     ("tenant",)),
    ("scheduler_tenant_carbon_grams_total", "Carbon of booked receipts by tenant (gCO2e; past the cap: other).",
     ("tenant",)),
)
DECISION_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)
OVERHEAD_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
TTFT_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STREAM_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
CONFIDENCE_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)

# The label values the hot paths see (methods x codes, policies x modes, the kinds of receipt)
# are few; the cap only bounds a misuse.
MAX_CACHED_KEYS = 1024


class RouterMetrics:
    """The counters and histograms of one router process. ``multiprocess_dir``: the shared
    directory of a ``--workers`` router (prometheus_client writes its values there when
    ``PROMETHEUS_MULTIPROC_DIR`` names it before the worker starts); the exposition then sums
    every worker's. None: this process's values alone."""

    def __init__(self, max_tenants: int = DEFAULT_MAX_TENANT_LABELS, multiprocess_dir: str | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess_dir = multiprocess_dir
        self.tenants = TenantLabels(max_tenants)
        self._counters = {name: Counter(name, text, labels, registry=self.registry) for name, text, labels in COUNTERS}
        self.decision_seconds = Histogram("scheduler_router_decision_seconds", "Time of one scheduling decision (s).",
                                          ("policy",), buckets=DECISION_BUCKETS_S, registry=self.registry)
        self.overhead_seconds = Histogram(
            "scheduler_router_overhead_seconds",
            "The router's own time: proxy, from the start of the call's work to its dispatch; route, the whole call (s).",
            ("mode",), buckets=OVERHEAD_BUCKETS_S, registry=self.registry)
        self.ttft_seconds = Histogram("scheduler_router_ttft_seconds", "Time to first token, as receipts say (s).",
                                      ("region",), buckets=TTFT_BUCKETS_S, registry=self.registry)
        self.stream_seconds = Histogram("scheduler_router_stream_duration_seconds",
                                        "Duration of billed streams (s).", ("region", "end_reason"),
                                        buckets=STREAM_BUCKETS_S, registry=self.registry)
        self.confidence = Histogram("scheduler_receipt_confidence", "Confidence of booked receipts' energy (0..1).",
                                    ("measurement_source",), buckets=CONFIDENCE_BUCKETS, registry=self.registry)
        # livesum: a worker that exits leaves its streams out of the sum.
        self.active_streams = Gauge("scheduler_router_active_streams", "Proxied streams open now.",
                                    registry=self.registry, multiprocess_mode="livesum")
        # The series every request, decision and receipt adds to, found once per label values
        # and kept (a labels() lookup per figure would cost more than the counting).
        self._request_children: dict[tuple[str, str], Counter] = {}
        self._decision_children: dict[tuple[str, str], tuple[Counter, Histogram]] = {}
        self._receipt_children: dict[tuple[str, ...], _ReceiptSeries] = {}
        self._fallback_children: dict[tuple[str, tuple[str, ...]], tuple[Counter, ...]] = {}
        self.proxy_overhead = self.overhead_seconds.labels("proxy")
        self.route_overhead = self.overhead_seconds.labels("route")

    def inc(self, name: str, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        counter = self._counters.get(name)
        if counter is None:
            raise KeyError(f"metric {name!r} is not a declared counter (scheduler.server.metrics.COUNTERS)")
        (counter.labels(**labels) if labels else counter).inc(amount)

    def request(self, method: str, code: str) -> None:
        child = self._request_children.get((method, code))
        if child is None:
            child = self._counters["scheduler_router_requests_total"].labels(method=method.rsplit("/", 1)[-1], code=code)
            if len(self._request_children) < MAX_CACHED_KEYS:
                self._request_children[(method, code)] = child
        child.inc()

    def decision(self, decision: Decision, seconds: float) -> None:
        mode = "unschedulable" if not decision.schedulable else "energy" if decision.energy_ranking else "fallback"
        children = self._decision_children.get((decision.policy, mode))
        if children is None:
            children = (self._counters["scheduler_router_decisions_total"].labels(policy=decision.policy, mode=mode),
                        self.decision_seconds.labels(decision.policy))
            if len(self._decision_children) < MAX_CACHED_KEYS:
                self._decision_children[(decision.policy, mode)] = children
        children[0].inc()
        children[1].observe(seconds)
        for fallback in decision.fallbacks:
            key = (fallback.signal, fallback.candidates)
            series = self._fallback_children.get(key)
            if series is None:
                fallbacks = self._counters["scheduler_router_fallbacks_total"]
                regions = sorted({candidate.split("/", 1)[0] for candidate in fallback.candidates}) or [""]
                series = tuple(fallbacks.labels(signal=fallback.signal, region=region) for region in regions)
                if len(self._fallback_children) < MAX_CACHED_KEYS:
                    self._fallback_children[key] = series
            for child in series:
                child.inc()

    def failovers(self, regions: Iterable[str]) -> None:
        for region in regions:
            self.inc("scheduler_router_failovers_total", {"region": region})

    def budget_rejection(self, tenant: str) -> None:
        self.inc("scheduler_budget_rejections_total", {"tenant": self.tenants.label(tenant)})

    def receipt(self, receipt: EnergyReceipt) -> None:
        """A booked receipt: its energy, carbon and tokens, and the stream's timings."""
        tenant = self.tenants.label(receipt.tenant)
        key = (receipt.region, receipt.pool, receipt.model, receipt.precision, receipt.carbon_basis,
               receipt.measurement_source, receipt.end_reason, tenant)
        series = self._receipt_children.get(key)
        if series is None:
            series = self._receipt_series(receipt, tenant)
            if len(self._receipt_children) < MAX_CACHED_KEYS:
                self._receipt_children[key] = series
        if receipt.energy_j is not None and receipt.energy_j > 0:
            series.energy_j.inc(receipt.energy_j)
            series.tenant_energy_j.inc(receipt.energy_j)
        if receipt.carbon_g is not None and receipt.carbon_g > 0:
            series.carbon_g.inc(receipt.carbon_g)
            series.tenant_carbon_g.inc(receipt.carbon_g)
        if receipt.avoided_j:
            series.avoided_j.inc(receipt.avoided_j)
        if receipt.prompt_tokens:
            series.prompt_tokens.inc(receipt.prompt_tokens)
        if receipt.completion_tokens:
            series.completion_tokens.inc(receipt.completion_tokens)
        if receipt.reused_tokens:
            series.reused_tokens.inc(receipt.reused_tokens)
        series.receipts.inc()
        if receipt.confidence is not None:
            series.confidence.observe(receipt.confidence)
        if receipt.ttft_ms is not None:
            series.ttft_s.observe(receipt.ttft_ms / 1000.0)
        if receipt.duration_ms > 0:
            series.stream_s.observe(receipt.duration_ms / 1000.0)

    def _receipt_series(self, receipt: EnergyReceipt, tenant: str) -> _ReceiptSeries:
        where = {"region": receipt.region, "pool": receipt.pool, "model": receipt.model}
        precision = receipt.precision or "unknown"
        counter = self._counters

        def tokens(kind: str) -> Counter:
            return counter["scheduler_tokens_total"].labels(**where, precision=precision, kind=kind)

        return _ReceiptSeries(
            energy_j=counter["scheduler_energy_joules_total"].labels(**where, precision=precision),
            carbon_g=counter["scheduler_carbon_grams_total"].labels(**where, basis=receipt.carbon_basis or "unknown"),
            avoided_j=counter["scheduler_avoided_energy_joules_total"].labels(**where),
            prompt_tokens=tokens("prompt"), completion_tokens=tokens("completion"), reused_tokens=tokens("reused"),
            receipts=counter["scheduler_receipts_total"].labels(
                region=receipt.region, measurement_source=receipt.measurement_source, end_reason=receipt.end_reason),
            tenant_energy_j=counter["scheduler_tenant_energy_joules_total"].labels(tenant=tenant),
            tenant_carbon_g=counter["scheduler_tenant_carbon_grams_total"].labels(tenant=tenant),
            confidence=self.confidence.labels(receipt.measurement_source),
            ttft_s=self.ttft_seconds.labels(receipt.region),
            stream_s=self.stream_seconds.labels(receipt.region, receipt.end_reason),
        )

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        """One sample's value in this process (0 when it was never counted)."""
        wanted = dict(labels or {})
        for family in self.registry.collect():
            for sample in family.samples:
                if sample.name == name and sample.labels == wanted:
                    return float(sample.value)
        return 0.0

    def exposition(self, gauges: Iterable[Sample] = ()) -> str:
        """The text of ``/metrics``: the counters and histograms (every worker's, summed, in
        multiprocess mode), then the gauges read now."""
        registry = CollectorRegistry(auto_describe=False)
        if self.multiprocess_dir is not None:
            MultiProcessCollector(registry, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        else:
            registry.register(_Families(self.registry.collect))
        samples = list(gauges)
        registry.register(_Families(lambda: sample_families(samples)))
        return generate_latest(registry).decode()


class _ReceiptSeries(NamedTuple):
    """The series one kind of receipt adds to (same region, pool, model, precision, carbon basis,
    measurement source, end and tenant label)."""

    energy_j: Counter
    carbon_g: Counter
    avoided_j: Counter
    prompt_tokens: Counter
    completion_tokens: Counter
    reused_tokens: Counter
    receipts: Counter
    tenant_energy_j: Counter
    tenant_carbon_g: Counter
    confidence: Histogram
    ttft_s: Histogram
    stream_s: Histogram


@dataclass(frozen=True)
class _Families(Collector):
    """A collector over a function that yields metric families (read at each scrape)."""

    families: Callable[[], Iterable[Metric]]

    def collect(self) -> Iterable[Metric]:
        return self.families()


def sample_families(samples: Sequence[Sample]) -> Iterator[Metric]:
    """Scrape-time samples as metric families: a name ending in ``_total`` is a counter, any
    other a gauge."""
    families: dict[str, Metric] = {}
    for name, labels, value in samples:
        family = families.get(name)
        if family is None:
            if name.endswith("_total"):
                family = Metric(name.removesuffix("_total"), name, "counter")
            else:
                family = Metric(name, name, "gauge")
            families[name] = family
        family.add_sample(name, dict(labels), value)
    return iter(families.values())


def fleet_samples(snapshot: FleetSnapshot) -> list[Sample]:
    """What the router's snapshot says about the fleet: each pool's live state (power, queue,
    running, KV use, replicas), what it serves, and each region's grid intensity and PUE."""
    samples: list[Sample] = []
    for candidate in snapshot.candidates:
        deployment = candidate.deployment
        samples.append(("scheduler_pool_info", {
            "region": candidate.region.name, "pool": candidate.pool.name, "gpu": candidate.pool.gpu,
            "model": deployment.name, "precision": deployment.precision,
            "tensor_parallel": str(deployment.tensor_parallel)}, 1.0))
    for region in snapshot.regions:
        samples.append(("scheduler_region_pue", {"region": region.name}, region.pue))
        signal = snapshot.carbon.get(region.carbon.zone)
        if signal is not None:
            samples.append(("scheduler_region_carbon_intensity_g_per_kwh",
                            {"region": region.name, "zone": region.carbon.zone}, signal.value))
        for pool in region.pools:
            where = {"region": region.name, "pool": pool.name}
            samples.append(("scheduler_pool_gpus", where, float(pool.count)))
            samples.append(("scheduler_pool_power_cap_watts", where, pool.power_cap_w * pool.count))
        state = snapshot.live.get(region.name)
        if state is None:
            continue
        for pool_name, live in sorted(state.pools.items()):
            where = {"region": region.name, "pool": pool_name}
            samples += [("scheduler_pool_queue_depth", where, float(live.queue_depth)),
                        ("scheduler_pool_running_requests", where, float(live.running)),
                        ("scheduler_pool_kv_cache_usage_ratio", where, live.kv_cache_usage),
                        ("scheduler_pool_prefix_cache_hit_ratio", where, live.prefix_cache_hit_rate),
                        ("scheduler_pool_arrival_rate", where, live.arrival_rate)]
            if live.gpu_power_w is not None:
                samples.append(("scheduler_pool_power_watts", where, live.gpu_power_w))
            if live.replicas is not None:
                samples.append(("scheduler_pool_replicas", where, float(live.replicas)))
    return samples


# The file each --workers worker writes its scrape-time counters to, in the shared directory.
SCRAPE_FILE_PREFIX = "scrape_counters_"


@dataclass
class SharedScrapeCounters:
    """``--workers``: the counters a worker reads at scrape time from its own parts (samples
    named ``*_total``: the carbon pollers', the config reloader's, the ports' refusals, stalled
    streams ...) count that worker alone. Each worker writes them to the shared directory every
    ``interval_s`` and as it stops; whichever worker answers a scrape adds the others' last
    written values to its own, so each is the pod's sum, as the prometheus_client counters are
    (a worker that died keeps its last counts in the sum: counters must not go down)."""

    directory: Path
    samples: Callable[[], Iterable[Sample]]
    interval_s: float = 1.0
    pid: int = field(default_factory=os.getpid)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)

    @property
    def path(self) -> Path:
        return self.directory / f"{SCRAPE_FILE_PREFIX}{self.pid}.json"

    def write(self) -> None:
        counters = [[name, dict(labels), value] for name, labels, value in self.samples() if name.endswith("_total")]
        partial = self.path.with_suffix(".tmp")
        partial.write_text(json.dumps(counters))
        partial.replace(self.path)  # a reader sees the old file or the new one, never half of one

    def merged(self) -> list[Sample]:
        """This worker's samples, with every other worker's last written counters added."""
        own = list(self.samples())
        totals: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for name, labels, value in own:
            if name.endswith("_total"):
                key = (name, tuple(sorted(labels.items())))
                totals[key] = totals.get(key, 0.0) + value
        for path in self.directory.glob(f"{SCRAPE_FILE_PREFIX}*.json"):
            if path == self.path:
                continue
            try:
                written = json.loads(path.read_text())
            except (OSError, ValueError):  # removed or replaced while read: skipped this scrape
                continue
            for name, labels, value in written:
                key = (name, tuple(sorted(labels.items())))
                totals[key] = totals.get(key, 0.0) + float(value)
        merged: list[Sample] = [sample for sample in own if not sample[0].endswith("_total")]
        merged.extend((name, dict(labels), value) for (name, labels), value in sorted(totals.items()))
        return merged

    async def start(self) -> None:
        self.write()
        self._task = start_loop(self._run, "metrics-scrape-counters")

    async def stop(self) -> None:
        await stop_task(self._task)
        self.write()

    async def _run(self) -> None:
        await run_every(self.interval_s, self._write_or_warn, "metrics: writing the counters",
                        first_after_s=self.interval_s)

    async def _write_or_warn(self) -> None:
        try:
            self.write()
        except OSError as exc:
            log.warning("metrics: cannot write %s: %s", self.path, exc)


# Scrapers (one connection each, kept alive) and the kubelet's probes (a connection per probe):
# a few per address; requests have no body.
METRICS_LIMITS = ServerLimits(max_header_bytes=8 * 1024, max_body_bytes=0, max_connections=64,
                              max_connections_per_client=8)


def http_samples(port: str, server: HttpServer) -> list[Sample]:
    """An HTTP port's gauges: connections open, bytes received, connections closed by a limit."""
    stats: ServerStats = server.stats
    samples: list[Sample] = [("scheduler_http_connections", {"port": port}, float(server.connections)),
                             ("scheduler_http_received_bytes_total", {"port": port}, float(stats.received_bytes))]
    samples.extend(("scheduler_http_refused_total", {"port": port, "reason": reason}, float(count))
                   for reason, count in sorted(stats.refused.items()))
    return samples


@dataclass
class MetricsEndpoint:
    """``GET /metrics`` and ``GET /healthz`` on ``host:port`` (0: any free port; ``reuse_port``:
    beside the other workers of a ``--workers`` router, each answering with the sum)."""

    render: Callable[[], str]
    serving: Callable[[], bool]
    # Loopback by default: open it (the router's --metrics-host) only where scrapers need it.
    host: str = "127.0.0.1"
    port: int = 0
    limits: ServerLimits = METRICS_LIMITS
    reuse_port: bool = False
    server: HttpServer = field(init=False)

    def __post_init__(self) -> None:
        self.server = HttpServer({("GET", "/metrics"): self._metrics, ("GET", "/healthz"): self._healthz},
                                 limits=self.limits, name="carbon-scheduler-metrics")

    async def start(self) -> None:
        self.port = await self.server.start(self.host, self.port, reuse_port=self.reuse_port)
        log.info("metrics and /healthz on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop(grace_s=1.0)

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, self.render().encode(), "text/plain; version=0.0.4; charset=utf-8")

    async def _healthz(self, request: HttpRequest) -> HttpResponse:
        if self.serving():
            return HttpResponse(200, b"SERVING\n", "text/plain")
        return HttpResponse(503, b"NOT_SERVING\n", "text/plain")
