"""``scheduler router``, ``scheduler keys create`` and ``scheduler bench router``."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

from scheduler.config.args import add_config_dirs

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    router = sub.add_parser("router", help="run the global router (gRPC)")
    router.add_argument("--host", default="0.0.0.0", help="address to bind (default: all interfaces)")
    router.add_argument("--port", type=int, default=50051, help="port to bind; 0 picks a free one (printed)")
    add_config_dirs(router)
    router.add_argument("--policy", default="default", help="routing policy name (a file in --policies)")
    router.add_argument("--state", default="memory", help="memory | redis://HOST:PORT/DB")
    router.add_argument("--namespace", default="default", help="key namespace in the state store")
    router.add_argument("--keys", type=Path, help="API keys file (without it: no authentication)")
    router.add_argument("--tls-cert", type=Path, help="server certificate (PEM)")
    router.add_argument("--tls-key", type=Path, help="server private key (PEM)")
    router.add_argument("--tls-client-ca", type=Path, help="CA for client certificates: mutual TLS")
    router.add_argument("--rate-limit", type=float, default=50.0, help="requests/s per tenant (default 50)")
    router.add_argument("--refresh-interval", type=float, default=0.5, help="snapshot refresh period, s")
    router.add_argument("--grace", type=float, default=10.0, help="seconds in-flight calls get at shutdown")
    router.add_argument("--budgets", type=Path, help="tenant energy/carbon budgets (YAML; see docs/deploying.md)")
    router.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics and /healthz over plain HTTP on this port (0: any free port)")
    router.add_argument("--no-carbon-pollers", action="store_true",
                        help="do not poll carbon providers (another process writes the signals)")
    router.set_defaults(handler=_router)

    keys = sub.add_parser("keys", help="manage tenant API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    create = keys_sub.add_parser("create", help="make a new key: prints it once, and the entry for the keys file")
    create.add_argument("--tenant", required=True)
    create.add_argument("--admin", action="store_true", help="may use RouterAdmin (kill switch, status)")
    create.add_argument("--rate-limit", type=float, help="requests/s for this tenant (default: the router's)")
    create.add_argument("--append", type=Path, metavar="FILE", help="also add the entry to this keys file")
    create.set_defaults(handler=_keys_create)


def register_bench(bench_sub: Any) -> None:
    bench = bench_sub.add_parser("router", help="TTFT the router adds over calling the region directly")
    bench.add_argument("--requests", type=int, default=2000, help="streams per path (default 2000)")
    bench.add_argument("--concurrency", type=int, default=64)
    bench.add_argument("--max-tokens", type=int, default=16)
    bench.add_argument("--first-token-delay-ms", type=float, default=0.0, help="the stub region's prefill time")
    bench.set_defaults(handler=_bench_router)


def _router(args: argparse.Namespace) -> int:
    import asyncio

    from scheduler.config.loader import ConfigError
    from scheduler.datalayer.snapshot import SnapshotBuilder
    from scheduler.ledger.budget import BudgetError, load_budgets
    from scheduler.plugins import load_checked_fleet
    from scheduler.server.app import TlsFiles, build_deps, serve_until_signalled, start_router, with_services
    from scheduler.server.auth import KeyRing
    from scheduler.state.factory import open_store

    if bool(args.tls_cert) != bool(args.tls_key) or (args.tls_client_ca and not args.tls_cert):
        print("--tls-cert and --tls-key go together; --tls-client-ca needs them", file=sys.stderr)
        return 2
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        policy = fleet.policy(args.policy)
        keys = KeyRing.load(args.keys) if args.keys else None
        budgets = load_budgets(args.budgets) if args.budgets else None
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return 1
    except BudgetError as exc:
        print(exc, file=sys.stderr)
        return 1
    if keys is None:
        log.warning("no --keys file: authentication is OFF, every caller is an admin (local use only)")
    tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca) if args.tls_cert else None
    backend = "memory" if args.state == "memory" else "redis"
    store = open_store(args.state, args.namespace)
    deps = build_deps(SnapshotBuilder(fleet.regions, policy), store, backend, keys=keys, tls=tls,
                      rate_limit_rps=args.rate_limit, refresh_interval_s=args.refresh_interval,
                      metrics_port=args.metrics_port)
    with_services(deps, carbon_pollers=not args.no_carbon_pollers, budgets=budgets)

    async def serve() -> None:
        running = await start_router(f"{args.host}:{args.port}", deps)
        print(f"router listening on {args.host}:{running.port}", flush=True)
        if running.metrics_endpoint is not None:
            print(f"metrics on http://{args.host}:{running.metrics_endpoint.port}/metrics", flush=True)
        await serve_until_signalled(running, args.grace)

    asyncio.run(serve())
    return 0


def _keys_create(args: argparse.Namespace) -> int:
    import yaml

    from scheduler.server.auth import create_key

    new = create_key(args.tenant, admin=args.admin, rate_limit_rps=args.rate_limit)
    print(f"key (shown once, give it to {args.tenant}):\n  {new.key}\n")
    print("entry for the keys file (under `keys:`):")
    print(new.entry_yaml())
    if args.append:
        existing = yaml.safe_load(args.append.read_text()) if args.append.exists() else None
        data = existing if isinstance(existing, dict) else {"keys": []}
        data.setdefault("keys", []).append(new.entry.model_dump(exclude_none=True))
        args.append.write_text(yaml.safe_dump(data, sort_keys=False))
        print(f"added to {args.append}")
    return 0


def _bench_router(args: argparse.Namespace) -> int:
    from scheduler.server.bench import run_router_bench

    return run_router_bench(args.requests, args.concurrency, args.max_tokens, args.first_token_delay_ms)
