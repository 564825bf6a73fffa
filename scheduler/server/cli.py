"""``scheduler router``, ``scheduler keys create`` and ``scheduler tickets``."""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.ledger.ledger import ENTRY_TTL_S
from scheduler.server.config_signing import TRUST_FILE_ENV
from scheduler.state.url import STATE_ENV
from scheduler.tickets import KEYS_FILE_ENV

if TYPE_CHECKING:
    from scheduler.http.server import ServerLimits
    from scheduler.server.app import GrpcLimits

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    from scheduler.logformat import LOG_FORMATS
    from scheduler.server import config_cli
    from scheduler.server.tenant_labels import DEFAULT_MAX_TENANT_LABELS

    config_cli.register(sub)
    router = sub.add_parser("router", help="run the global router (gRPC)")
    router.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: loopback only; 0.0.0.0: all interfaces)")
    router.add_argument("--port", type=int, default=50051, help="port to bind; 0 picks a free one (printed)")
    add_config_dirs(router)
    router.add_argument("--policy", default="default", help="routing policy name (a file in --policies)")
    router.add_argument("--state", default=None,
                        help="memory | redis://HOST:PORT/DB (local use: a password here shows in ps; default: "
                             f"--state-file, else ${STATE_ENV}, else memory)")
    router.add_argument("--state-file", type=Path, metavar="PATH",
                        help="a file holding the state store URL, password included (a mounted Secret); "
                             f"keeps it out of the process's arguments, as ${STATE_ENV} does")
    router.add_argument("--namespace", default="default", help="key namespace in the state store")
    router.add_argument("--keys", type=Path,
                        help="API keys file (`scheduler keys create --append FILE`); re-read when it changes "
                             "or on SIGHUP. Required unless --insecure")
    router.add_argument("--insecure", action="store_true",
                        help="run WITHOUT authentication: every caller is an admin (local development only; "
                             "warned at every start)")
    router.add_argument("--keys-reload-interval", type=float, default=2.0,
                        help="seconds between checks of the config files (regions/, policies/, --keys, --budgets) "
                             "for changes, which are then reloaded (default 2; 0: only on SIGHUP or "
                             "`scheduler config reload`; docs/hot-reload.md)")
    router.add_argument("--config-sync-interval", type=float, default=1.0,
                        help="seconds between reads of the fleet's config version in the state store: a version "
                             "another router published is adopted within it (default 1)")
    router.add_argument("--config-trust", type=Path, metavar="FILE", default=os.environ.get(TRUST_FILE_ENV) or None,
                        help="public keys whose signed config versions this router adopts and publishes "
                             f"(`scheduler config keygen --trust FILE`; default ${TRUST_FILE_ENV}). Without it "
                             "the router neither adopts nor publishes versions (docs/hot-reload.md)")
    router.add_argument("--config-signature", type=Path, metavar="FILE",
                        help="the operator's signature of this router's config files (`scheduler config sign`): "
                             "with it the router publishes them to the fleet")
    router.add_argument("--config-allow-unsigned", action="store_true",
                        help="also adopt and publish UNSIGNED config versions: whoever can write the store then "
                             "controls the fleet (local development only; warned at every start)")
    router.add_argument("--max-streams-per-tenant", type=int, default=None,
                        help="concurrent Generate streams one tenant may hold on this router; a key's "
                             "max_concurrent_streams overrides it (default 64: a quarter of one region gateway "
                             "replica's 256; docs/security.md)")
    router.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    router.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    router.add_argument("--tls-client-ca", type=Path, help="CA for client certificates: mutual TLS")
    router.add_argument("--rate-limit", type=float, default=50.0,
                        help="requests/s per tenant, shared by all routers on the state store (default 50)")
    router.add_argument("--refresh-interval", type=float, default=0.5, help="snapshot refresh period, s")
    router.add_argument("--grace", type=float, default=10.0, help="seconds in-flight calls get at shutdown")
    router.add_argument("--idempotency-window", type=_idempotency_window, default=ENTRY_TTL_S, metavar="S",
                        help=f"how long the ledger's entries and the audit's markers are kept: receipts of one "
                             f"dispatch target that reach the store further apart are booked twice; the store "
                             f"holds ~580 bytes per request for this long (default {ENTRY_TTL_S:,.0f}; "
                             f"docs/state-keys.md)")
    router.add_argument("--budgets", type=Path,
                        help="tenant energy/carbon budgets (YAML; see docs/deploying.md); reloaded like the keys")
    router.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics and /healthz over plain HTTP on this port (0: any free port)")
    router.add_argument("--metrics-host", default="127.0.0.1",
                        help="address of the /metrics endpoint (default: loopback only; 0.0.0.0 for scrapers)")
    router.add_argument("--metrics-max-tenants", type=int, default=DEFAULT_MAX_TENANT_LABELS,
                        help="tenants that get their own label on the per-tenant metrics, per router process; "
                             "every later tenant is counted as tenant=\"other\" (default "
                             f"{DEFAULT_MAX_TENANT_LABELS}; docs/deploying.md)")
    router.add_argument("--log-format", choices=LOG_FORMATS, default="text",
                        help="text (default) or json: one JSON object a line, with the trace and span ids of "
                             "the request being served when it is traced (docs/deploying.md)")
    router.add_argument("--http-port", type=int, default=None,
                        help="also serve the HTTP front door on this port: the OpenAI API (/v1/completions, "
                             "/v1/chat/completions, /v1/models) and Route for the SDK's direct mode (Connect "
                             "protocol); same keys and TLS as gRPC (0: any free port)")
    router.add_argument("--http-host", default="127.0.0.1",
                        help="address of the HTTP front door (default: loopback only)")
    router.add_argument("--workers", type=int, default=1,
                        help="router processes on the same ports (SO_REUSEPORT), one per core the pod has; "
                             "needs --state redis://... and fixed ports (default 1; docs/deploying.md)")
    router.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)
    router.add_argument("--no-carbon-pollers", action="store_true",
                        help="do not poll carbon providers (another process writes the signals)")
    router.add_argument("--ticket-keys", type=Path, default=os.environ.get(KEYS_FILE_ENV) or None,
                        help=f"regions' dispatch-ticket keys (`scheduler tickets keygen`; default ${KEYS_FILE_ENV})")
    router.add_argument("--insecure-no-tickets", action="store_true",
                        help="dispatch without tickets (regions must run with tickets disabled; development only)")
    router.add_argument("--direct-targets", type=int, default=3,
                        help="ranked candidates a Route answer signs tickets for (direct mode; default 3)")
    router.add_argument("--max-stream-s", type=float, default=600.0,
                        help="longest a Generate stream may last, whatever the client's deadline; past it "
                             "the stream ends with DEADLINE_EXCEEDED and a partial receipt (0: no limit; default 600)")
    # What one client may hold and how long it may take, per port (docs/security.md).
    router.add_argument("--http-max-connections", type=int, default=10_000,
                        help="connections the HTTP front door holds at once; past it 503 (default 10000)")
    router.add_argument("--http-max-connections-per-client", type=int, default=1_000,
                        help="connections one remote address may hold on the HTTP front door; past it 503 "
                             "(0: no cap; behind a proxy that hides client addresses raise it or use 0; default 1000)")
    router.add_argument("--metrics-max-connections", type=int, default=64,
                        help="connections the /metrics port holds at once (default 64)")
    router.add_argument("--metrics-max-connections-per-client", type=int, default=8,
                        help="connections one remote address may hold on the /metrics port (0: no cap; default 8)")
    router.add_argument("--grpc-max-connections", type=int, default=10_000,
                        help="connections the gRPC port holds at once; past them refused at accept (default 10000; "
                             "grpcio has no per-address cap)")
    router.add_argument("--grpc-max-streams-per-connection", type=int, default=100,
                        help="calls one gRPC connection may have open at once (HTTP/2 MAX_CONCURRENT_STREAMS; "
                             "default 100)")
    router.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a client has to send a request's line and headers on the HTTP and /metrics "
                             "ports (a new connection: its first request's), and to finish the TLS and HTTP/2 "
                             "handshake on the gRPC port; past it 408, or closed (default 10)")
    router.add_argument("--body-timeout", type=float, default=30.0,
                        help="seconds a request's body may take to arrive after its headers (HTTP and /metrics "
                             "ports); past it 408 (default 30)")
    router.add_argument("--idle-timeout", type=float, default=75.0,
                        help="seconds a kept-alive connection may wait for its next request (on gRPC: without "
                             "calls) before it is closed, on every port (default 75)")
    router.add_argument("--write-timeout", type=float, default=30.0,
                        help="seconds an answer may wait on a client that does not read (HTTP: the socket's "
                             "buffer full; gRPC: flow control), on every port; past it the stream is ended and "
                             "billed as cancelled (default 30)")
    router.add_argument("--otlp-endpoint", metavar="URL",
                        help="export request traces (OpenTelemetry) to this OTLP collector over http/protobuf, "
                             "e.g. http://collector:4318 (needs the `otlp` extra; default: "
                             "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT, else off; "
                             "docs/tracing.md)")
    router.add_argument("--otlp-service-name", default=os.environ.get("OTEL_SERVICE_NAME") or "carbon-scheduler-router",
                        help="service.name of the exported traces (default $OTEL_SERVICE_NAME, else "
                             "carbon-scheduler-router)")
    from scheduler.server.deferral_settings import add_arguments as add_deferral_arguments
    add_deferral_arguments(router)
    router.set_defaults(handler=_router)

    tickets = sub.add_parser("tickets", help="manage the regions' dispatch-ticket keys")
    tickets_sub = tickets.add_subparsers(dest="tickets_command", required=True, metavar="ACTION")
    keygen = tickets_sub.add_parser("keygen", help="new keys for every region (or add a key to an existing file)")
    add_config_dirs(keygen)
    keygen.add_argument("--rotate", type=Path, metavar="FILE",
                        help="keep this file's keys and add a new one per region (made active with --activate)")
    keygen.add_argument("--activate", action="store_true", help="with --rotate: sign with the new keys at once")
    keygen.add_argument("--kid", help="key id of the new keys (default: k<unix time>)")
    keygen.set_defaults(handler=_tickets_keygen)
    extract = tickets_sub.add_parser("extract", help="one region's entry of a key file (what its gateway mounts)")
    extract.add_argument("--region", required=True)
    extract.add_argument("file", type=Path)
    extract.set_defaults(handler=_tickets_extract)
    prune = tickets_sub.add_parser("prune", help="drop every key but the active one (the last step of a rotation)")
    prune.add_argument("file", type=Path)
    prune.set_defaults(handler=_tickets_prune)

    keys = sub.add_parser("keys", help="manage tenant API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="make a new key: prints it once, and the entry for the keys file")
    create.add_argument("--tenant", required=True)
    create.add_argument("--admin", action="store_true", help="may use RouterAdmin (kill switch, status)")
    create.add_argument("--rate-limit", type=float, help="requests/s for this tenant (default: the router's)")
    create.add_argument("--max-streams", type=int,
                        help="concurrent Generate streams for this tenant per router (default: the router's)")
    create.add_argument("--jurisdictions", type=_codes, default=(),
                        help="comma-separated jurisdictions this key's requests may run in, e.g. EU "
                             "(default: any the request allows)")
    create.add_argument("--append", type=Path, metavar="FILE", help="also add the entry to this keys file")
    create.set_defaults(handler=_keys_create)


def _router(args: argparse.Namespace) -> int:
    import asyncio

    from scheduler.config.loader import ConfigError
    from scheduler.datalayer.snapshot import SnapshotBuilder
    from scheduler.ledger.budget import BudgetError, load_budgets
    from scheduler.logformat import use_log_format
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.server.app import TlsFiles, build_deps, serve_until_signalled, start_router, with_services
    from scheduler.server.auth import KeyRing
    from scheduler.server.config_reload.metrics import config_samples
    from scheduler.server.config_reload.reloader import ConfigReloader
    from scheduler.server.config_reload.sources import ConfigSources, load_local
    from scheduler.server.config_signing import ConfigTrust, SigningError
    from scheduler.server.edge import current_span
    from scheduler.server.metrics import RouterMetrics
    from scheduler.server.stream_slots import StreamSlots
    from scheduler.server.tracing import RouterTracing
    from scheduler.server.workers import MULTIPROC_ENV
    from scheduler.state.factory import open_store
    from scheduler.state.url import StateUrlError, resolve_state_url
    from scheduler.tickets import TicketKeyRing, TicketKeysError

    use_log_format(args.log_format, current_span)
    if args.metrics_max_tenants < 0:
        print(f"--metrics-max-tenants: expected an integer >= 0, got {args.metrics_max_tenants}", file=sys.stderr)
        return 2
    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        print("--tls-cert and --tls-key go together; --tls-client-ca needs them", file=sys.stderr)
        return 2
    from scheduler.server.tracing import TracingUnavailable, otlp_traces_url, traces_endpoint_from

    traces = traces_endpoint_from(args.otlp_endpoint, os.environ)
    if traces is not None:
        try:
            otlp_traces_url(traces.url, traces.source, traces.exact)
        except TracingUnavailable as exc:
            print(exc, file=sys.stderr)
            return 2
    try:
        state = resolve_state_url(args.state, args.state_file, "memory")
        trust = (ConfigTrust.load(args.config_trust, args.config_allow_unsigned) if args.config_trust
                 else ConfigTrust(allow_unsigned=args.config_allow_unsigned))
    except (StateUrlError, SigningError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if state.source == "--state" and state.has_password:
        log.warning("--state holds a password, which every local user can read in the process list (ps): "
                    "pass --state-file PATH or set $%s instead", STATE_ENV)
    if args.workers != 1:
        return _supervise(args, state.url)
    sources = ConfigSources(args.regions, args.policies, args.policy, args.keys, args.budgets, args.config_signature)
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        fleet.policy(args.policy)
        for warning in fleet.warnings:
            log.warning("%s", warning)
        if args.keys:
            KeyRing.load(args.keys)
        if args.budgets:
            load_budgets(args.budgets)
        ticket_keys = TicketKeyRing.load(args.ticket_keys) if args.ticket_keys else None
        if ticket_keys is not None:
            # A plain vLLM region checks no ticket: it needs no key (docs/byo-vllm.md).
            enforcing = {r.name for r in compile_fleet(fleet.regions).regions if r.tickets_enforced}
            missing = sorted(enforcing - set(ticket_keys.regions))
            if missing:
                raise TicketKeysError(f"{args.ticket_keys}: no keys for regions {missing}")
        # What the router runs on: every file read once, checked as a reload checks it.
        initial = load_local(sources, ticket_keys, str(args.ticket_keys))
        policy, keys, budgets = initial.policy, initial.keys, initial.budgets
        unset = sorted({f"${pool.vllm.api_key_env} ({region.name}/{pool.name})" for region in fleet.regions
                        for pool in region.pools if pool.vllm is not None and pool.vllm.api_key_env is not None
                        and not os.environ.get(pool.vllm.api_key_env)})
        if unset:
            print(f"{args.regions}: the API keys of plain vLLM servers are not set in this router's environment: "
                  f"{', '.join(unset)} (docs/byo-vllm.md)", file=sys.stderr)
            return exit_codes.CONFIG
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return exit_codes.CONFIG
    except BudgetError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    if keys is None and not args.insecure:
        print("no --keys file: make one with `scheduler keys create --tenant NAME --append keys.yaml`, "
              "or pass --insecure to run without authentication (local development only)", file=sys.stderr)
        return 2
    if not args.max_stream_s >= 0:
        print(f"--max-stream-s: expected seconds >= 0 (0: no limit), got {args.max_stream_s}", file=sys.stderr)
        return 2
    if args.max_streams_per_tenant is not None and args.max_streams_per_tenant < 1:
        print(f"--max-streams-per-tenant: expected at least 1, got {args.max_streams_per_tenant}", file=sys.stderr)
        return 2
    from scheduler.server.deferral_settings import settings_from
    try:
        grpc_limits, http_limits, metrics_limits = connection_limits(args)
        deferral = settings_from(args)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if keys is None:
        log.warning("--insecure: authentication is OFF, every caller is an admin (local development only)")
    elif args.insecure:
        log.warning("--insecure ignored: --keys %s is given, callers must present a key", args.keys)
    if ticket_keys is None and not args.insecure_no_tickets:
        print(f"no --ticket-keys (or ${KEYS_FILE_ENV}): make them with `scheduler tickets keygen`, "
              "or pass --insecure-no-tickets for development", file=sys.stderr)
        return 2
    tracing = RouterTracing()
    if traces is not None:
        # One exporter per worker process, each its own service instance.
        tracing = RouterTracing.otlp(traces.url, args.otlp_service_name,
                                     instance_id=f"{socket.gethostname()}:{os.getpid()}", source=traces.source,
                                     exact=traces.exact)
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    if trust.allow_unsigned:
        log.warning("--config-allow-unsigned: config versions without a signature are adopted, so whoever can "
                    "write the state store controls this router (local development only)")
    elif trust.standalone and state.url != "memory":
        log.warning("no --config-trust: this router runs on its own config files and neither adopts nor publishes "
                    "versions through the state store (docs/hot-reload.md)")
    if args.config_signature and trust.standalone:
        log.warning("--config-signature %s ignored: without --config-trust this router publishes nothing",
                    args.config_signature)
    backend = "memory" if state.url == "memory" else "redis"
    try:
        store = open_store(state.url, args.namespace)
    except ValueError:
        print(f"{state.source}: expected 'memory' or redis://HOST:PORT/DB, got {state.shown!r}", file=sys.stderr)
        return 2
    policies = {name: compile_policy(each) for name, each in initial.policies.items()}
    deps = build_deps(SnapshotBuilder(compile_fleet(initial.regions), policies[policy.name]), store, backend, keys=keys,
                      tls=tls, rate_limit_rps=args.rate_limit, refresh_interval_s=args.refresh_interval,
                      metrics_port=args.metrics_port, ticket_keys=ticket_keys, policies=policies, deferral=deferral)
    # A worker of --workers counts into the directory its parent made (scheduler.server.workers).
    multiprocess_dir = os.environ.get(MULTIPROC_ENV) if args.worker_index is not None else None
    deps.metrics = RouterMetrics(args.metrics_max_tenants, multiprocess_dir)
    deps.direct_targets = args.direct_targets
    deps.tracing = tracing
    deps.metrics_host = args.metrics_host
    deps.http_port, deps.http_host = args.http_port, args.http_host
    deps.grpc_limits, deps.http_limits, deps.metrics_limits = grpc_limits, http_limits, metrics_limits
    if args.worker_index is not None:
        # One of --workers: the ports are shared (SO_REUSEPORT), /metrics too: any worker answers
        # with every worker's counters.
        deps.reuse_port = True
    from dataclasses import replace
    deps.dispatcher.settings = replace(deps.dispatcher.settings, max_stream_s=args.max_stream_s or None)
    if args.max_streams_per_tenant is not None:
        deps.slots = StreamSlots(args.max_streams_per_tenant)
    with_services(deps, carbon_pollers=not args.no_carbon_pollers, budgets=budgets,
                  idempotency_window_s=args.idempotency_window)
    # Hot reload (docs/hot-reload.md): last in the start order, so every part it swaps is up.
    reloader = ConfigReloader(deps, sources, initial, ticket_keys=ticket_keys, ticket_keys_file=str(args.ticket_keys),
                              trust=trust, watch_interval_s=args.keys_reload_interval,
                              sync_interval_s=args.config_sync_interval)
    deps.config = reloader
    deps.background.append(reloader)
    deps.gauges.append(lambda: config_samples(reloader))

    _raise_open_files_limit()

    async def serve() -> None:
        running = await start_router(f"{args.host}:{args.port}", deps)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.on_sighup)
        worker = "" if args.worker_index is None else f" (worker {args.worker_index})"
        print(f"router listening on {args.host}:{running.port}{worker}", flush=True)
        if running.metrics_endpoint is not None:
            print(f"metrics on http://{args.metrics_host}:{running.metrics_endpoint.port}/metrics", flush=True)
        if running.http_port is not None:
            scheme = "https" if tls is not None else "http"
            print(f"HTTP front door on {scheme}://{args.http_host}:{running.http_port}", flush=True)
        await serve_until_signalled(running, args.grace)

    # uvloop: the router's per-request work is mostly I/O callbacks (grpc.aio runs on it too).
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(serve())
    return 0


def connection_limits(args: argparse.Namespace) -> tuple[GrpcLimits, ServerLimits, ServerLimits]:
    """The gRPC, HTTP front door and /metrics limits from the router's flags; ``ValueError``
    naming the flag and the value when one is out of range."""
    from dataclasses import replace

    from scheduler.http.server import ServerLimits
    from scheduler.server.app import GrpcLimits
    from scheduler.server.http_api import MAX_BODY_BYTES
    from scheduler.server.metrics import METRICS_LIMITS

    counts = (("--http-max-connections", args.http_max_connections, 1),
              ("--http-max-connections-per-client", args.http_max_connections_per_client, 0),
              ("--metrics-max-connections", args.metrics_max_connections, 1),
              ("--metrics-max-connections-per-client", args.metrics_max_connections_per_client, 0),
              ("--grpc-max-connections", args.grpc_max_connections, 1),
              ("--grpc-max-streams-per-connection", args.grpc_max_streams_per_connection, 1))
    for flag, count, least in counts:
        if count < least:
            raise ValueError(f"{flag}: expected an integer >= {least}, got {count}")
    for flag, seconds in (("--header-timeout", args.header_timeout), ("--body-timeout", args.body_timeout),
                          ("--idle-timeout", args.idle_timeout), ("--write-timeout", args.write_timeout)):
        if not 0 < seconds < math.inf:
            raise ValueError(f"{flag}: expected seconds > 0, got {seconds}")
    timeouts = {"header_timeout_s": args.header_timeout, "body_timeout_s": args.body_timeout,
                "idle_timeout_s": args.idle_timeout, "write_timeout_s": args.write_timeout}
    http = ServerLimits(max_body_bytes=MAX_BODY_BYTES, max_connections=args.http_max_connections,
                        max_connections_per_client=args.http_max_connections_per_client, **timeouts)
    metrics = replace(METRICS_LIMITS, max_connections=args.metrics_max_connections,
                      max_connections_per_client=args.metrics_max_connections_per_client, **timeouts)
    grpc = GrpcLimits(max_connections=args.grpc_max_connections,
                      max_streams_per_connection=args.grpc_max_streams_per_connection,
                      handshake_timeout_s=args.header_timeout, idle_timeout_s=args.idle_timeout,
                      write_timeout_s=args.write_timeout)
    return grpc, http, metrics


def _supervise(args: argparse.Namespace, state_url: str) -> int:
    from scheduler.server.workers import Supervisor

    problems = []
    if args.workers < 1:
        problems.append(f"--workers: expected at least 1, got {args.workers}")
    if state_url == "memory":
        problems.append("--workers > 1 needs a shared state store: --state redis://HOST:PORT/DB (the workers share "
                        "rate limits, the ledger, the audit stream and the kill switch through it)")
    if args.port == 0 or args.http_port == 0 or args.metrics_port == 0:
        problems.append("--workers > 1 needs fixed ports (0 would give every worker its own)")
    if problems:
        for problem in problems:
            print(problem, file=sys.stderr)
        return 2
    print(f"router: {args.workers} workers on {args.host}:{args.port}", flush=True)
    return Supervisor(args.argv, args.workers, args.grace).run()


def _raise_open_files_limit() -> None:
    """Every proxied stream holds two sockets (client and region): lift the soft limit on open
    files to the hard one, as servers do (1,024 would cap a router near 500 streams)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = 1 << 20
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 4096:
        log.warning("the open-files limit is %d: this router can hold about %d streams at once", hard, hard // 2)


def _idempotency_window(text: str) -> float:
    """Seconds, from 10 minutes (past the retries of one write and a lock holder's restart)
    to 40 days."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 600.0 <= seconds <= 40 * 86400.0:
        raise argparse.ArgumentTypeError(f"must be within [600, 3456000] s, got {text}")
    return seconds


def _codes(text: str) -> tuple[str, ...]:
    """``EU,US`` -> ("EU", "US") (upper-cased; the keys file checks each code)."""
    return tuple(code.strip().upper() for code in text.split(",") if code.strip())


def _keys_create(args: argparse.Namespace) -> int:
    import pydantic
    import yaml

    from scheduler.server.auth import create_key

    try:
        new = create_key(args.tenant, admin=args.admin, rate_limit_rps=args.rate_limit,
                         max_concurrent_streams=args.max_streams, jurisdictions=args.jurisdictions)
    except pydantic.ValidationError as exc:
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            print(f"keys create: {field}: {error['msg']} (got {error['input']!r})", file=sys.stderr)
        return 2
    print(f"key (shown once, give it to {args.tenant}):\n  {new.key}\n")
    print("entry for the keys file (under `keys:`):")
    print(new.entry_yaml())
    if args.append:
        existing = yaml.safe_load(args.append.read_text()) if args.append.exists() else None
        data = existing if isinstance(existing, dict) else {"keys": []}
        data.setdefault("keys", []).append(new.entry_dict())
        args.append.write_text(yaml.safe_dump(data, sort_keys=False))
        print(f"added to {args.append}")
    return 0


def _tickets_keygen(args: argparse.Namespace) -> int:
    from scheduler.config.loader import ConfigError
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.tickets import RegionKeys, TicketKeyRing, TicketKeysError

    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        existing = TicketKeyRing.load(args.rotate) if args.rotate else TicketKeyRing()
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return exit_codes.CONFIG
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    regions = {}
    for region in fleet.regions:
        new = RegionKeys.generate(region.name, args.kid)
        old = existing.regions.get(region.name)
        if old is None:
            regions[region.name] = new
            continue
        if new.active in old.keys:
            print(f"{args.rotate}: regions.{region.name} already has key id {new.active!r}", file=sys.stderr)
            return 1
        active = new.active if args.activate else old.active
        regions[region.name] = RegionKeys(region.name, active, {**old.keys, **new.keys})
    print(TicketKeyRing(regions).to_yaml(), end="")
    return 0


def _tickets_extract(args: argparse.Namespace) -> int:
    from scheduler.tickets import TicketKeyRing, TicketKeysError

    try:
        print(TicketKeyRing.load(args.file).only(args.region).to_yaml(), end="")
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    return 0


def _tickets_prune(args: argparse.Namespace) -> int:
    from scheduler.tickets import RegionKeys, TicketKeyRing, TicketKeysError

    try:
        ring = TicketKeyRing.load(args.file)
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    pruned = {name: RegionKeys(name, keys.active, {keys.active: keys.keys[keys.active]})
              for name, keys in ring.regions.items()}
    print(TicketKeyRing(pruned).to_yaml(), end="")
    return 0
