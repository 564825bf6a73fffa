"""``scheduler router``, ``scheduler keys create`` and ``scheduler tickets``."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from scheduler.config.args import add_config_dirs
from scheduler.tickets import KEYS_FILE_ENV

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    router = sub.add_parser("router", help="run the global router (gRPC)")
    router.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default: loopback only; 0.0.0.0: all interfaces)")
    router.add_argument("--port", type=int, default=50051, help="port to bind; 0 picks a free one (printed)")
    add_config_dirs(router)
    router.add_argument("--policy", default="default", help="routing policy name (a file in --policies)")
    router.add_argument("--state", default="memory", help="memory | redis://HOST:PORT/DB")
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
    router.add_argument("--max-streams-per-tenant", type=int, default=None,
                        help="concurrent Generate streams one tenant may hold on this router; a key's "
                             "max_concurrent_streams overrides it (default: a quarter of the dispatch pool, 256)")
    router.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    router.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    router.add_argument("--tls-client-ca", type=Path, help="CA for client certificates: mutual TLS")
    router.add_argument("--rate-limit", type=float, default=50.0,
                        help="requests/s per tenant, shared by all routers on the state store (default 50)")
    router.add_argument("--refresh-interval", type=float, default=0.5, help="snapshot refresh period, s")
    router.add_argument("--grace", type=float, default=10.0, help="seconds in-flight calls get at shutdown")
    router.add_argument("--budgets", type=Path,
                        help="tenant energy/carbon budgets (YAML; see docs/deploying.md); reloaded like the keys")
    router.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics and /healthz over plain HTTP on this port (0: any free port)")
    router.add_argument("--metrics-host", default="127.0.0.1",
                        help="address of the /metrics endpoint (default: loopback only; 0.0.0.0 for scrapers)")
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
    router.add_argument("--otlp-endpoint", metavar="URL",
                        help="export request traces (OpenTelemetry) to this OTLP collector over http/protobuf, "
                             "e.g. http://collector:4318 (needs the `otlp` extra; default: tracing off; "
                             "docs/tracing.md)")
    router.add_argument("--otlp-service-name", default="carbon-scheduler-router",
                        help="service.name of the exported traces (default carbon-scheduler-router)")
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
    from scheduler.plugins import load_checked_fleet
    from scheduler.server.app import TlsFiles, build_deps, serve_until_signalled, start_router, with_services
    from scheduler.server.auth import KeyRing
    from scheduler.server.config_reload import ConfigReloader, ConfigSources, load_local
    from scheduler.server.stream_slots import StreamSlots
    from scheduler.server.tracing import RouterTracing
    from scheduler.state.factory import open_store
    from scheduler.tickets import TicketKeyRing, TicketKeysError

    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        print("--tls-cert and --tls-key go together; --tls-client-ca needs them", file=sys.stderr)
        return 2
    if args.otlp_endpoint:
        from scheduler.server.tracing import TracingUnavailable, otlp_traces_url
        try:
            otlp_traces_url(args.otlp_endpoint)
        except TracingUnavailable as exc:
            print(exc, file=sys.stderr)
            return 2
    if args.workers != 1:
        return _supervise(args)
    sources = ConfigSources(args.regions, args.policies, args.policy, args.keys, args.budgets)
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        fleet.policy(args.policy)
        if args.keys:
            KeyRing.load(args.keys)
        if args.budgets:
            load_budgets(args.budgets)
        ticket_keys = TicketKeyRing.load(args.ticket_keys) if args.ticket_keys else None
        if ticket_keys is not None:
            missing = sorted({r.name for r in fleet.regions} - set(ticket_keys.regions))
            if missing:
                raise TicketKeysError(f"{args.ticket_keys}: no keys for regions {missing}")
        # What the router runs on: every file read once, checked as a reload checks it.
        initial = load_local(sources, ticket_keys, str(args.ticket_keys))
        policy, keys, budgets = initial.policy, initial.keys, initial.budgets
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return 1
    except BudgetError as exc:
        print(exc, file=sys.stderr)
        return 1
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
    if args.otlp_endpoint:
        # One exporter per worker process, each its own service instance.
        tracing = RouterTracing.otlp(args.otlp_endpoint, args.otlp_service_name,
                                     instance_id=f"{socket.gethostname()}:{os.getpid()}")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    backend = "memory" if args.state == "memory" else "redis"
    store = open_store(args.state, args.namespace)
    deps = build_deps(SnapshotBuilder(initial.regions, policy), store, backend, keys=keys, tls=tls,
                      rate_limit_rps=args.rate_limit, refresh_interval_s=args.refresh_interval,
                      metrics_port=args.metrics_port, ticket_keys=ticket_keys, policies=initial.policies,
                      deferral=deferral)
    deps.direct_targets = args.direct_targets
    deps.tracing = tracing
    deps.metrics_host = args.metrics_host
    deps.http_port, deps.http_host = args.http_port, args.http_host
    if args.worker_index is not None:
        # One of --workers: the ports are shared (SO_REUSEPORT); each has its own /metrics.
        deps.reuse_port = True
        if deps.metrics_port is not None:
            deps.metrics_port += args.worker_index
    from dataclasses import replace
    deps.dispatcher.settings = replace(deps.dispatcher.settings, max_stream_s=args.max_stream_s or None)
    if args.max_streams_per_tenant is not None:
        deps.slots = StreamSlots(args.max_streams_per_tenant)
    with_services(deps, carbon_pollers=not args.no_carbon_pollers, budgets=budgets)
    # Hot reload (docs/hot-reload.md): last in the start order, so every part it swaps is up.
    reloader = ConfigReloader(deps, sources, initial, ticket_keys=ticket_keys, ticket_keys_file=str(args.ticket_keys),
                              watch_interval_s=args.keys_reload_interval, sync_interval_s=args.config_sync_interval)
    deps.config = reloader
    deps.background.append(reloader)
    deps.gauges.append(reloader.samples)

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


def _supervise(args: argparse.Namespace) -> int:
    from scheduler.server.workers import Supervisor

    problems = []
    if args.workers < 1:
        problems.append(f"--workers: expected at least 1, got {args.workers}")
    if args.state == "memory":
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
    from scheduler.plugins import load_checked_fleet
    from scheduler.tickets import RegionKeys, TicketKeyRing, TicketKeysError

    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        existing = TicketKeyRing.load(args.rotate) if args.rotate else TicketKeyRing()
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return 1
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return 1
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
        return 1
    return 0


def _tickets_prune(args: argparse.Namespace) -> int:
    from scheduler.tickets import RegionKeys, TicketKeyRing, TicketKeysError

    try:
        ring = TicketKeyRing.load(args.file)
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return 1
    pruned = {name: RegionKeys(name, keys.active, {keys.active: keys.keys[keys.active]})
              for name, keys in ring.regions.items()}
    print(TicketKeyRing(pruned).to_yaml(), end="")
    return 0
