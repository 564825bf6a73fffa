"""The router's Prometheus metrics and a small plaintext HTTP endpoint for them.

Counters (monotonic, since the process started):
  scheduler_router_requests_total{method, code}     every call, by its final gRPC status
  scheduler_router_decisions_total{policy, mode}    mode: energy | fallback | unschedulable
  scheduler_router_fallbacks_total{signal}          each fallback a decision took
  scheduler_router_failovers_total                  regions that failed before the first token
  scheduler_budget_rejections_total{tenant}         Generate calls refused by a hard budget
Gauges (read from the router's state at scrape time):
  scheduler_router_energy_routing_enabled, scheduler_router_active_streams,
  scheduler_carbon_signal_age_seconds{zone}, scheduler_router_region_healthy{region},
  scheduler_router_region_state_age_seconds{region} (since its last published state),
  scheduler_ledger_pending_receipts, plus the carbon pollers' counters and the config
  reloader's (scheduler_config_*: the version in use, reloads by trigger and result, and each
  problem of the last refused reload by file and field; scheduler.server.config_reload).

``MetricsEndpoint`` serves ``GET /metrics`` (Prometheus text format 0.0.4) and ``GET /healthz``
(200 while the gRPC health status is SERVING, else 503) on a separate plaintext port, so
that probes and scrapers need no TLS client certificate. It runs on the router's HTTP server
(scheduler.http.server) with limits for a port only scrapers and probes use
(``METRICS_LIMITS``: a few connections per address, no bodies, the same timeouts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from scheduler.http.server import HttpRequest, HttpResponse, HttpServer, ServerLimits, ServerStats
from scheduler.types import Decision

log = logging.getLogger(__name__)

Sample = tuple[str, Mapping[str, str], float]
_HELP = {
    "scheduler_router_requests_total": ("counter", "Router calls by method and final gRPC status code."),
    "scheduler_router_decisions_total": ("counter", "Routing decisions by policy and ranking mode."),
    "scheduler_router_fallbacks_total": ("counter", "Fallbacks taken by decisions, by signal."),
    "scheduler_router_failovers_total": ("counter", "Regions that failed before the first token."),
    "scheduler_budget_rejections_total": ("counter", "Generate calls refused by a tenant's hard budget."),
}


_CounterKey = tuple[str, tuple[tuple[str, str], ...]]


# Methods x codes and policies x modes are few; the cap only bounds a misuse.
MAX_CACHED_KEYS = 1024


@dataclass
class RouterMetrics:
    _counters: dict[_CounterKey, float] = field(default_factory=dict)
    # The counters every request and decision adds to, by what names them: their keys are made
    # once (a request's method and code, a decision's policy and mode), not per request.
    _request_keys: dict[tuple[str, str], _CounterKey] = field(default_factory=dict)
    _decision_keys: dict[tuple[str, str], _CounterKey] = field(default_factory=dict)

    def inc(self, name: str, labels: Mapping[str, str] | None = None, amount: float = 1.0) -> None:
        self._add((name, tuple(sorted((labels or {}).items()))), amount)

    def _add(self, key: _CounterKey, amount: float = 1.0) -> None:
        self._counters[key] = self._counters.get(key, 0.0) + amount

    def request(self, method: str, code: str) -> None:
        key = self._request_keys.get((method, code))
        if key is None:
            key = ("scheduler_router_requests_total", (("code", code), ("method", method.rsplit("/", 1)[-1])))
            if len(self._request_keys) < MAX_CACHED_KEYS:
                self._request_keys[(method, code)] = key
        self._add(key)

    def decision(self, decision: Decision) -> None:
        mode = "unschedulable" if not decision.schedulable else "energy" if decision.energy_ranking else "fallback"
        key = self._decision_keys.get((decision.policy, mode))
        if key is None:
            key = ("scheduler_router_decisions_total", (("mode", mode), ("policy", decision.policy)))
            if len(self._decision_keys) < MAX_CACHED_KEYS:
                self._decision_keys[(decision.policy, mode)] = key
        self._add(key)
        for fallback in decision.fallbacks:
            self.inc("scheduler_router_fallbacks_total", {"signal": fallback.signal})

    def value(self, name: str, labels: Mapping[str, str] | None = None) -> float:
        return self._counters.get((name, tuple(sorted((labels or {}).items()))), 0.0)

    def exposition(self, gauges: Iterable[Sample] = ()) -> str:
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            for (sample, pairs), value in sorted(self._counters.items()):
                if sample == name:
                    lines.append(_line(name, dict(pairs), value))
        seen: set[str] = set()
        for gauge, labels, value in gauges:
            if gauge not in seen:
                seen.add(gauge)
                lines.append(f"# TYPE {gauge} {'counter' if gauge.endswith('_total') else 'gauge'}")
            lines.append(_line(gauge, labels, value))
        return "\n".join(lines) + "\n"


def _line(name: str, labels: Mapping[str, str], value: float) -> str:
    if not labels:
        return f"{name} {value:g}"
    body = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
    return f"{name}{{{body}}} {value:g}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
    """``GET /metrics`` and ``GET /healthz`` on ``host:port`` (0: any free port)."""

    render: Callable[[], str]
    serving: Callable[[], bool]
    # Loopback by default: open it (the router's --metrics-host) only where scrapers need it.
    host: str = "127.0.0.1"
    port: int = 0
    limits: ServerLimits = METRICS_LIMITS
    server: HttpServer = field(init=False)

    def __post_init__(self) -> None:
        self.server = HttpServer({("GET", "/metrics"): self._metrics, ("GET", "/healthz"): self._healthz},
                                 limits=self.limits, name="carbon-scheduler-metrics")

    async def start(self) -> None:
        self.port = await self.server.start(self.host, self.port)
        log.info("metrics and /healthz on http://%s:%d", self.host, self.port)

    async def stop(self) -> None:
        await self.server.stop(grace_s=1.0)

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, self.render().encode(), "text/plain; version=0.0.4")

    async def _healthz(self, request: HttpRequest) -> HttpResponse:
        if self.serving():
            return HttpResponse(200, b"SERVING\n", "text/plain")
        return HttpResponse(503, b"NOT_SERVING\n", "text/plain")
