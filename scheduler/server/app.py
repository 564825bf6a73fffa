"""Assembling the router: ``RouterDeps`` (everything injected), ``create_server`` and the
start/stop lifecycle of the server and its background tasks.

``create_server(address, deps) -> (server, port)`` binds (port 0 for tests) but starts
nothing; ``start_router`` starts the background tasks (the snapshot refresher first, so the
first request sees the store), then the server, and marks health SERVING; ``stop`` drains
in the reverse order (health NOT_SERVING, in-flight calls get ``grace_s``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from scheduler.canary.runtime import CanaryRuntime
from scheduler.datalayer.carbon.metrics import signal_gauges as carbon_signal_gauges
from scheduler.datalayer.probes import RegionProbes
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.http.server import HttpServer, ServerLimits
from scheduler.ledger.budget import TenantBudget
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.health import region_verdict
from scheduler.policy import Policy
from scheduler.server.audit import AuditLog
from scheduler.server.auth import KeyRing, TenantRateLimiter
from scheduler.server.config_reload.reloader import ConfigReloader
from scheduler.server.deferral_api import Deferrals
from scheduler.server.deferral_settings import DeferralSettings
from scheduler.server.dispatch import RegionDispatcher
from scheduler.server.edge import EdgeInterceptor
from scheduler.server.http_api import MAX_BODY_BYTES, build_http_server, server_ssl_context
from scheduler.server.issuer import TicketIssuer
from scheduler.server.metrics import (
    METRICS_LIMITS,
    MetricsEndpoint,
    RouterMetrics,
    Sample,
    SharedScrapeCounters,
    fleet_samples,
    http_samples,
)
from scheduler.server.rate_limit import SharedRateLimiter
from scheduler.server.region_receipt_ingest import RegionReceiptIngest
from scheduler.server.servicers import GlobalRouterService, RouterAdminService
from scheduler.server.stalls import StalledWrites
from scheduler.server.stream_slots import StreamSlots
from scheduler.server.tracing import RouterTracing
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tickets import TicketKeyRing
from scheduler.types import EnergyReceipt, Request
from scheduler.v1 import admin_pb2, admin_pb2_grpc, router_pb2, router_pb2_grpc

log = logging.getLogger(__name__)

# After grpc's stop: how long the cancelled streams' handlers get to book their partial receipts.
STREAM_UNWIND_S = 2.0

SERVICE_NAMES = (
    router_pb2.DESCRIPTOR.services_by_name["GlobalRouter"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["RouterAdmin"].full_name,
)


class BackgroundTask(Protocol):
    """Started before the server serves, stopped after it drained (carbon pollers, ...)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    # Set: mutual TLS, clients must present a certificate signed by this CA.
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        client_ca = self.client_ca.read_bytes() if self.client_ca else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=client_ca,
            require_client_auth=client_ca is not None,
        )


@dataclass(frozen=True)
class GrpcLimits:
    """What one client may hold on the gRPC port (grpcio's channel arguments, and the edge's
    write watch). grpcio has no per-address connection cap and one message limit for every
    call: a call's key is checked before its message is read instead (scheduler.server.edge)."""

    # Connections at once (grpc.max_allowed_incoming_connections; refused at accept past it).
    max_connections: int = 10_000
    # Calls one connection may have open at once (grpc.max_concurrent_streams; HTTP/2's
    # recommended minimum, above a tenant's default stream cap).
    max_streams_per_connection: int = 100
    # The largest request (a 4 MiB prompt and its envelope, as the HTTP front door's body);
    # larger: RESOURCE_EXHAUSTED.
    max_message_bytes: int = MAX_BODY_BYTES
    # A new connection's TLS and HTTP/2 handshake, to the client's SETTINGS
    # (grpc.server_handshake_timeout_ms; gRPC's default is 120 s).
    handshake_timeout_s: float = 10.0
    # A connection without calls this long is sent GOAWAY (grpc.max_connection_idle_ms).
    idle_timeout_s: float = 75.0
    # How long one message may wait on a client that does not read (scheduler.server.stalls).
    write_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_streams_per_connection", "max_message_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"GrpcLimits.{name}: expected an integer >= 1, got {value!r}")
        for name in ("handshake_timeout_s", "idle_timeout_s", "write_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"GrpcLimits.{name}: expected seconds > 0, got {value!r}")

    def options(self) -> list[tuple[str, int]]:
        return [("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_concurrent_streams", self.max_streams_per_connection),
                ("grpc.max_allowed_incoming_connections", self.max_connections),
                ("grpc.server_handshake_timeout_ms", round(self.handshake_timeout_s * 1000)),
                ("grpc.max_connection_idle_ms", round(self.idle_timeout_s * 1000)),
                # Off: with it gRPC grows every stream's receive window to 4 MiB before the
                # server reads anything, so a call refused from its metadata could still push
                # 4 MiB per stream. Off, a stream gets 64 KiB until its message is read, and
                # the window grows to a message's size while it is being read.
                ("grpc.http2.bdp_probe", 0)]


def _version() -> str:
    try:
        return metadata.version("carbon-scheduler")
    except metadata.PackageNotFoundError:
        return "dev"


@dataclass
class RouterDeps:
    scheduler: Scheduler
    refresher: SnapshotRefresher
    store: StateStore
    dispatcher: RegionDispatcher
    audit: AuditLog
    # None: no authentication (every caller is the local admin; local use only). Replaced
    # when the keys file is reloaded (scheduler.server.keys_reload); the edge reads it per call.
    keys: KeyRing | None = None
    # Requests/s per tenant (a key may set its own), shared by the routers through the store.
    rate_limit_rps: float = 50.0
    limiter: SharedRateLimiter = field(init=False)
    # Concurrent Generate streams per tenant on this router (a key may set its own).
    slots: StreamSlots = field(default_factory=StreamSlots)
    tls: TlsFiles | None = None
    # Extra tasks run with the server (e.g. carbon pollers): append before start_router.
    background: list[BackgroundTask] = field(default_factory=list)
    # Called with every receipt, after the audit entry is queued (e.g. the ledger); must not block.
    receipt_sinks: list[Callable[[EnergyReceipt], None]] = field(default_factory=list)
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    # Gauges read at scrape time (the ledger's queue, the carbon pollers' counters, ...).
    gauges: list[Callable[[], Iterable[Sample]]] = field(default_factory=list)
    # Plaintext /metrics and /healthz port (None: not served; 0: any free port) and address.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # The HTTP front door (scheduler.server.http_api: Connect Route, the OpenAI API; TLS as
    # gRPC's): its port (None: not served; 0: any free port) and address.
    http_port: int | None = None
    http_host: str = "127.0.0.1"
    # Bind with SO_REUSEPORT: one of several worker processes on the same ports (--workers).
    reuse_port: bool = False
    # Called before a Generate is dispatched (e.g. the tenant's energy budget); may raise a
    # SchedulerError (BudgetExhausted -> RESOURCE_EXHAUSTED); must not block.
    admission: list[Callable[[Request], object]] = field(default_factory=list)
    # Signs a dispatch ticket per region (None: regions run without tickets, development only).
    tickets: TicketIssuer | None = None
    # How many ranked candidates a Route answer carries tickets for (direct mode).
    direct_targets: int = 3
    # Request traces (OpenTelemetry), this router's own provider; off (no provider) by default.
    tracing: RouterTracing = field(default_factory=RouterTracing)
    # The policy's canary (scheduler.canary): counts each proxied stream per arm, reads the arm's
    # state with the refresher (which carries it into each snapshot). None: no canary support.
    canary: CanaryRuntime | None = None
    # Hot reload of the config files and the fleet's config version (None: this router has no
    # files to reload, e.g. one built in-process; RouterAdmin/ReloadConfig then says so). It is
    # also in ``background`` (scheduler.server.config_reload).
    config: ConfigReloader | None = None
    # The deferral queue's submit, fetch and release loop (scheduler.server.deferral_api; None: this
    # router neither holds nor releases deferred requests). Started last, stopped first: a
    # release cut short by the stop books its partial receipt while the ledger still runs.
    deferrals: Deferrals | None = None
    # What one client may hold and how long it may take, per port (docs/security.md).
    grpc_limits: GrpcLimits = field(default_factory=GrpcLimits)
    http_limits: ServerLimits = field(default_factory=lambda: ServerLimits(max_body_bytes=MAX_BODY_BYTES))
    metrics_limits: ServerLimits = METRICS_LIMITS
    state_backend: str = "memory"
    host_id: str = field(default_factory=socket.gethostname)
    version: str = field(default_factory=_version)
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    active_streams: int = 0

    def __post_init__(self) -> None:
        self.limiter = SharedRateLimiter(self.store, TenantRateLimiter(default_rps=self.rate_limit_rps))

    def book(self, receipt: EnergyReceipt) -> None:
        """Audit and every receipt sink (the ledger): the end of every answered request."""
        self.audit.record(receipt)
        self.metrics.receipt(receipt)
        for sink in self.receipt_sinks:
            sink(receipt)

    def lifecycle(self) -> list[BackgroundTask]:
        """Start order; stopped in reverse (tracing last: the final streams' spans are flushed)."""
        deferrals = [] if self.deferrals is None else [self.deferrals]
        return [self.tracing, self.refresher, self.audit, self.limiter, *self.background, *deferrals]


def build_deps(
    builder: SnapshotBuilder,
    store: StateStore,
    state_backend: str,
    keys: KeyRing | None = None,
    tls: TlsFiles | None = None,
    rate_limit_rps: float = 50.0,
    refresh_interval_s: float = 0.5,
    metrics_port: int | None = None,
    ticket_keys: TicketKeyRing | None = None,
    policies: Mapping[str, Policy] | None = None,
    deferral: DeferralSettings | None = None,
) -> RouterDeps:
    """The router's parts without the optional services (see ``with_services``). ``policies``:
    every loaded policy by name, where the policy's canary arm is found (default: the policy alone);
    ``deferral``: the deferral queue's caps, retention and stores (default: ``DeferralSettings()``)."""
    if ticket_keys is None:
        log.warning("no ticket keys: dispatches go out unsigned; regions must run with tickets disabled "
                    "(development only)")
    canary = CanaryRuntime(store, dict(policies) if policies is not None else {builder.policy.name: builder.policy})
    deps = RouterDeps(
        tickets=None if ticket_keys is None else TicketIssuer(ticket_keys),
        metrics_port=metrics_port,
        scheduler=Scheduler.from_registry(default_scheduler_registry()),
        # The router's own probes of each region: what routing rests on while a shared store
        # is unreachable (an embedded memory store cannot be).
        refresher=SnapshotRefresher(builder, store, interval_s=refresh_interval_s,
                                    probes=None if state_backend == "memory" else RegionProbes.of(builder.regions),
                                    canary=canary),
        store=store,
        dispatcher=RegionDispatcher(),
        audit=AuditLog(store),
        keys=keys,
        rate_limit_rps=rate_limit_rps,
        tls=tls,
        state_backend=state_backend,
        canary=canary,
    )
    # The canary's writer: its last counts are flushed at stop, before the store closes.
    deps.background.append(canary)
    deps.gauges.append(canary.samples)
    deferrals = Deferrals(deps, deferral)
    deps.deferrals = deferrals
    deps.gauges.append(deferrals.samples)
    return deps


def with_services(
    deps: RouterDeps,
    *,
    carbon_pollers: bool = True,
    budgets: Mapping[str, TenantBudget] | None = None,
    idempotency_window_s: float | None = None,
) -> RouterDeps:
    """Add what a production router runs beside the servicers: the carbon pollers (one
    router polls each provider and zone, through the store's lock) and the tenant ledger
    (every receipt recorded; hard budgets enforced before dispatch)."""
    from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
    from scheduler.ledger.ledger import ENTRY_TTL_S, Ledger
    from scheduler.ledger.service import LedgerService

    builder = deps.refresher.builder
    if carbon_pollers:
        pollers = CarbonPollers.from_regions(builder.regions, deps.store)
        deps.background.append(pollers)
        deps.gauges.append(pollers.counters.samples)
    # One window for the ledger's entries and the audit's markers: receipts of one dispatch
    # target that reach the store further apart than this are booked twice (docs/billing.md).
    # (None: the ledger's ENTRY_TTL_S.)
    window_s = ENTRY_TTL_S if idempotency_window_s is None else idempotency_window_s
    deps.audit.once_ttl_s = window_s
    ledger = LedgerService(Ledger(deps.store, budgets or {},
                                  critical_workload_classes=builder.policy.critical_workload_classes,
                                  entry_ttl_s=window_s))
    deps.background.append(ledger)
    deps.gauges.append(lambda: [("scheduler_ledger_pending_receipts", {}, float(ledger.pending)),
                                *ledger.budget_samples()])
    deps.receipt_sinks.append(ledger.sink)
    deps.admission.append(ledger.admit)
    if deps.tickets is not None:
        # The receipts regions sign are booked like the router's own (after the ledger in the
        # list, so it stops first and its last batch still reaches the ledger); its cursor moves
        # past a batch once the audit and the ledger wrote it.
        async def written() -> bool:
            try:
                await deps.audit.flush()
            except StateUnavailable:
                return False
            return await ledger.write()

        ingest = RegionReceiptIngest(deps.store, deps.tickets.keys, deps.book, written, book_idle=ledger.sink_idle)
        deps.background.append(ingest)
        deps.gauges.append(lambda: [("scheduler_region_receipts_booked", {}, float(ingest.booked)),
                                    ("scheduler_region_receipts_rejected", {}, float(ingest.rejected))])
    return deps


def create_server(
    address: str, deps: RouterDeps, health: HealthServicer | None = None, stalls: StalledWrites | None = None,
) -> tuple[grpc.aio.Server, int]:
    """The gRPC server with every service, bound to ``address`` (``127.0.0.1:0``: any free port);
    not started. ``health``: the health servicer to serve (a new one, NOT_SERVING, if None);
    ``stalls``: what ends its streams whose client stopped reading (a new one if None)."""
    limits = deps.grpc_limits
    if stalls is None:
        stalls = StalledWrites(limits.write_timeout_s, deps.dispatcher.settings.max_stream_s)
    server = grpc.aio.server(
        interceptors=[EdgeInterceptor(lambda: deps.keys, deps.limiter, deps.metrics, deps.slots, deps.tracing,
                                      stalls)],
        options=[("grpc.so_reuseport", 1 if deps.reuse_port else 0), ("grpc.keepalive_permit_without_calls", 1),
                 *limits.options()],
    )
    # The generated grpc modules carry no type annotations.
    router_pb2_grpc.add_GlobalRouterServicer_to_server(GlobalRouterService(deps), server)  # type: ignore[no-untyped-call]
    admin_pb2_grpc.add_RouterAdminServicer_to_server(RouterAdminService(deps), server)  # type: ignore[no-untyped-call]
    health = health or HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (*SERVICE_NAMES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME),
        server,
    )
    tls = deps.tls
    port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"could not bind {address}")
    return server, port


def router_gauges(deps: RouterDeps) -> list[Sample]:
    """The router's own gauges, from its current snapshot (no I/O)."""
    snapshot = deps.refresher.current()
    samples: list[Sample] = [
        ("scheduler_router_energy_routing_enabled", {}, float(snapshot.energy_routing_enabled)),
    ]
    samples.extend(fleet_samples(snapshot))
    for zone, signal in sorted(snapshot.carbon.items()):
        samples.append(("scheduler_carbon_signal_age_seconds", {"zone": zone}, snapshot.now - signal.observed_at))
    samples.extend(carbon_signal_gauges(snapshot))  # usable now (signal_check), else why not
    for region in snapshot.regions:
        healthy = region_verdict(snapshot, region.name) is None
        samples.append(("scheduler_router_region_healthy", {"region": region.name}, float(healthy)))
        state = snapshot.live.get(region.name)
        published = state.observed_at if state is not None else snapshot.last_seen.get(region.name)
        if published is not None:  # (a region never seen has no age)
            samples.append(("scheduler_router_region_state_age_seconds", {"region": region.name},
                            snapshot.now - published))
    samples.extend(deps.limiter.samples())
    samples.extend(deps.slots.samples())
    for gauge in deps.gauges:
        samples.extend(gauge())
    return samples


@dataclass
class RunningRouter:
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    deps: RouterDeps
    stalls: StalledWrites
    metrics_endpoint: MetricsEndpoint | None = None
    http: HttpServer | None = None
    http_port: int | None = None
    serving: bool = False
    _started: list[BackgroundTask] = field(default_factory=list)

    def samples(self) -> list[Sample]:
        """Every gauge of /metrics: the router's and its ports' (connections, refusals, stalls)."""
        samples = router_gauges(self.deps)
        samples.extend(("scheduler_router_stalled_streams_total", {"reason": reason}, float(count))
                       for reason, count in sorted(self.stalls.ended.items()))
        if self.metrics_endpoint is not None:
            samples.extend(http_samples("metrics", self.metrics_endpoint.server))
        if self.http is not None:
            samples.extend(http_samples("http", self.http))
        return samples

    async def stop(self, grace_s: float = 5.0) -> None:
        self.serving = False
        await self.health.enter_graceful_shutdown()
        http, self.http = self.http, None
        await asyncio.gather(self.server.stop(grace_s), *([http.stop(grace_s)] if http is not None else []))
        # grpc cancels the streams still open after the grace without waiting for their
        # handlers, which book a partial receipt as they unwind: let them, before the ledger
        # and the audit writer stop (bounded: a handler stuck elsewhere must not hold the stop).
        unwound_by = time.monotonic() + STREAM_UNWIND_S
        while self.deps.active_streams > 0 and time.monotonic() < unwound_by:
            await asyncio.sleep(0.01)
        for task in reversed(self._started):
            try:
                await task.stop()
            except Exception:
                log.exception("stopping %r failed", task)
        await self.deps.dispatcher.stop()
        await self.deps.store.close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()


async def start_router(address: str, deps: RouterDeps) -> RunningRouter:
    health = HealthServicer()
    stalls = StalledWrites(deps.grpc_limits.write_timeout_s, deps.dispatcher.settings.max_stream_s)
    server, port = create_server(address, deps, health, stalls)
    running = RunningRouter(server, port, health, deps, stalls)
    try:
        for task in deps.lifecycle():
            await task.start()
            running._started.append(task)
        if deps.metrics_port is not None:
            samples: Callable[[], Iterable[Sample]] = running.samples
            if deps.metrics.multiprocess_dir is not None:
                # --workers: the counters each worker reports at scrape time, summed over them.
                shared = SharedScrapeCounters(Path(deps.metrics.multiprocess_dir), running.samples)
                await shared.start()
                running._started.append(shared)
                samples = shared.merged
            endpoint = MetricsEndpoint(lambda: deps.metrics.exposition(samples()), lambda: running.serving,
                                       host=deps.metrics_host, port=deps.metrics_port, limits=deps.metrics_limits,
                                       reuse_port=deps.reuse_port)
            await endpoint.start()
            running.metrics_endpoint = endpoint
            running._started.append(endpoint)
        if deps.http_port is not None:
            http = build_http_server(deps, deps.http_limits, lambda: running.serving)
            tls = deps.tls
            context = None if tls is None else server_ssl_context(tls.cert, tls.key, tls.client_ca)
            running.http_port = await http.start(deps.http_host, deps.http_port, context, reuse_port=deps.reuse_port)
            running.http = http
            log.info("HTTP front door on %s://%s:%d (Connect Route, OpenAI API)",
                     "https" if context else "http", deps.http_host, running.http_port)
        await server.start()
    except BaseException:
        await running.stop(grace_s=0)
        raise
    for name in ("", *SERVICE_NAMES):
        await health.set(name, health_pb2.HealthCheckResponse.SERVING)
    running.serving = True
    log.info("router serving on port %d (%s state, %s)", port, deps.state_backend,
             "TLS" if deps.tls else "plaintext")
    return running


async def serve_until_signalled(running: RunningRouter, grace_s: float = 5.0) -> None:
    """Serve until SIGINT/SIGTERM, then shut down gracefully."""
    import signal

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: draining in-flight calls for up to %.0f s", grace_s)
    await running.stop(grace_s)
