"""``scheduler up``: the local multi-region stack (Ray in-process, region apps, the router);
``scheduler up --demo``: the same, plus a trace replay and a report, then exit."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs
from scheduler.config.loader import ConfigError
from scheduler.config.schema import RegionConfig
from scheduler.region import DEFAULT_LOCAL_REGIONS
from scheduler.server.auth import KeyRing, NewKey, create_key
from scheduler.state.store import StateStore

# The local stack's key: an admin of tenant "local" (the demo's requests name other tenants),
# with a rate no replay reaches; made fresh for every run and kept in memory only.
LOCAL_TENANT = "local"
LOCAL_RATE_RPS = 10_000.0


def local_key() -> NewKey:
    return create_key(LOCAL_TENANT, admin=True, rate_limit_rps=LOCAL_RATE_RPS)


def register(sub: Any) -> None:
    up = sub.add_parser("up", help="run regions (Ray Serve + vLLM) and the router locally until Ctrl-C")
    add_config_dirs(up)
    up.add_argument("--policy", default="default", help="routing policy name (default: %(default)s)")
    up.add_argument("--only", default=",".join(DEFAULT_LOCAL_REGIONS),
                    help="regions to deploy, comma-separated; each costs ~3 GB here (default: %(default)s)")
    up.add_argument("--state", default=None,
                    help="state store URL (default: redis://127.0.0.1:6379/0 if it answers, else memory)")
    up.add_argument("--namespace", default=None,
                    help="state key namespace (default: local; --demo: a fresh one, deleted at exit)")
    up.add_argument("--router", default="127.0.0.1:50051", help="router gRPC address (port 0: any free port)")
    up.add_argument("--http-port", type=int, default=8000, help="Serve HTTP port, if free (else any free port)")
    up.add_argument("--router-http-port", type=int, default=8080,
                    help="the router's HTTP front door (OpenAI API, Route for direct mode), if free (else any)")
    up.add_argument("--ticket-keys", type=Path,
                    help="the regions' dispatch-ticket keys (default: fresh keys for this run, kept in memory)")
    up.add_argument("--insecure-no-tickets", action="store_true",
                    help="regions accept requests without a dispatch ticket (development only)")
    up.add_argument("--insecure", action="store_true",
                    help="the router accepts calls without an API key (default: a fresh admin key per run, printed)")
    up.add_argument("--demo", action="store_true", help="replay a trace slice, print a report, shut down, exit")
    up.add_argument("--demo-requests", type=int, default=150, help="requests to replay with --demo")
    up.set_defaults(handler=_up)
    register_region(sub)


def register_region(sub: Any) -> None:
    region = sub.add_parser("region", help="a region's side-cars (plain vLLM regions: docs/byo-vllm.md)")
    actions = region.add_subparsers(dest="region_command", required=True, metavar="ACTION")
    scrape = actions.add_parser("scrape", help="publish a plain vLLM region's live state (kind: vllm), read from "
                                               "its servers' /metrics, about once a second")
    add_config_dirs(scrape)
    scrape.add_argument("--region", required=True, help="the region (its file in --regions says kind: vllm)")
    scrape.add_argument("--state", default=None,
                        help="state store URL, the routers' (default: from --state-file, else $SCHEDULER_STATE)")
    scrape.add_argument("--state-file", type=Path, metavar="PATH",
                        help="a file holding the state store URL (keeps a password out of the process list)")
    scrape.add_argument("--namespace", default="default", help="key namespace in the state store, the routers' "
                                                              "(default: %(default)s)")
    scrape.add_argument("--interval", type=float, default=1.0, help="seconds between passes (default: %(default)s)")
    scrape.add_argument("--timeout", type=float, default=1.0,
                        help="seconds a server has to answer a pass (default: %(default)s)")
    scrape.add_argument("--once", action="store_true", help="one pass: publish it, print it as JSON, exit "
                                                           "(1 when no pool answered)")
    scrape.set_defaults(handler=_scrape)


def _scrape(args: argparse.Namespace) -> int:
    from scheduler.plugins.checked_fleet import load_checked_fleet
    from scheduler.state.factory import open_store
    from scheduler.state.url import StateUrlError, resolve_state_url

    try:
        fleet = load_checked_fleet(args.regions, args.policies)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return exit_codes.CONFIG
    region = next((r for r in fleet.regions if r.name == args.region), None)
    if region is None:
        print(f"--region: no region {args.region!r} in {args.regions} (regions: "
              f"{', '.join(r.name for r in fleet.regions)})", file=sys.stderr)
        return exit_codes.CONFIG
    if region.kind != "vllm":
        print(f"--region {region.name}: its kind is {region.kind!r}: its gateway publishes its own live state; "
              "only a region of kind 'vllm' is scraped (docs/byo-vllm.md)", file=sys.stderr)
        return exit_codes.CONFIG
    if not (args.interval > 0 and args.timeout > 0):
        print(f"--interval and --timeout: expected seconds > 0, got {args.interval} and {args.timeout}",
              file=sys.stderr)
        return exit_codes.USAGE
    try:
        state = resolve_state_url(args.state, args.state_file, "")
    except StateUrlError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.USAGE
    if not state.url or state.url == "memory":
        print("--state: the routers' shared store, redis://HOST:PORT/DB (an in-memory store reaches no router)",
              file=sys.stderr)
        return exit_codes.USAGE
    try:
        store = open_store(state.url, args.namespace)
    except ValueError as exc:
        print(f"{state.source}: {exc}", file=sys.stderr)
        return exit_codes.USAGE
    return asyncio.run(_scrape_region(region, store, args.interval, args.timeout, args.once))


async def _scrape_region(region: RegionConfig, store: StateStore, interval_s: float, timeout_s: float, once: bool) -> int:
    import httpx

    from scheduler.config.compile import compile_fleet
    from scheduler.region.publisher import RegionStatePublisher
    from scheduler.region.vllm_scrape import VllmRegionSource
    from scheduler.state import codec

    async with httpx.AsyncClient() as client:
        source = VllmRegionSource(compile_fleet((region,)).regions[0], client, timeout_s)
        publisher = RegionStatePublisher(region.name, source, store, interval_s=interval_s)
        try:
            if once:
                published = await publisher.publish_once()
                if published is None:
                    print(f"region {region.name}: the state store refused the write", file=sys.stderr)
                    return exit_codes.FAILURE
                print(codec.encode_region_state(published).decode())
                return exit_codes.OK if published.healthy else exit_codes.FAILURE
            servers = sum(len(pool.vllm.urls) for pool in region.pools if pool.vllm is not None)
            _say(f"region {region.name}: publishing the live state of {servers} vLLM servers every {interval_s:g} s; "
                 "Ctrl-C to stop")
            task = asyncio.ensure_future(publisher.run())
            await _until_signalled()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return exit_codes.OK
        finally:
            await store.close()


def register_bench(bench: Any) -> None:
    ttft = bench.add_parser("region-ttft", help="time to first token through the router vs straight to a region")
    ttft.add_argument("--region", default="eu-north", help="the one region to deploy (default: %(default)s)")
    ttft.add_argument("--probes", type=int, default=30, help="sequential requests each way (default: %(default)s)")
    ttft.set_defaults(handler=_bench_ttft)


def _bench_ttft(args: argparse.Namespace) -> int:
    return asyncio.run(_ttft(args.region, args.probes))


async def _ttft(region: str, probes: int) -> int:
    from tokenizers import Tokenizer

    from scheduler.region import demo
    from scheduler.region.stack import LocalStack, StackOptions
    from scheduler.region.tiny_model import ensure_tiny_model

    api_key = local_key()
    stack = LocalStack(StackOptions(only=(region,), state_url="memory", dashboard=False, http_port=0,
                                    router_address="127.0.0.1:0", api_keys=KeyRing.of([api_key.entry])), say=_say)
    try:
        await stack.start()
        tokenizer = Tokenizer.from_file(str(ensure_tiny_model() / "tokenizer.json"))
        result = await demo.probe_ttft(stack.router_target, tokenizer,
                                       demo.DemoOptions(probes=probes, api_key=api_key.key))
    finally:
        await stack.stop()
    for name, samples in (("proxy mode", result.router_s), ("direct mode", result.direct_mode_s),
                          (f"{region} alone", result.region_s)):
        ms = [s * 1000 for s in samples]
        print(f"TTFT {name:<22} n={len(ms):<4} p50 {demo.percentile(ms, 50):6.1f} ms   "
              f"p90 {demo.percentile(ms, 90):6.1f} ms   p99 {demo.percentile(ms, 99):6.1f} ms")
    return 0


def _up(args: argparse.Namespace) -> int:
    from scheduler.region.stack import StackOptions, free_port
    from scheduler.tickets import TicketKeyRing, TicketKeysError

    try:
        ticket_keys = TicketKeyRing.load(args.ticket_keys) if args.ticket_keys else None
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    if args.insecure_no_tickets:
        _say("WARNING: --insecure-no-tickets: anyone who reaches a region can run requests on it, unbilled")

    api_key = None if args.insecure else local_key()
    if api_key is None:
        _say("WARNING: --insecure: the router accepts calls without an API key (local development only)")

    host, _, port = args.router.rpartition(":")
    router_port = free_port(int(port)) if port != "0" else 0
    options = StackOptions(
        regions_dir=args.regions, policies_dir=args.policies, policy=args.policy,
        only=tuple(name.strip() for name in args.only.split(",") if name.strip()),
        state_url=args.state, namespace=args.namespace or ("local" if not args.demo else None),
        clean_namespace=args.demo, router_address=f"{host or '127.0.0.1'}:{router_port}",
        http_port=args.http_port, router_http_port=free_port(args.router_http_port) if args.router_http_port else 0,
        tickets=not args.insecure_no_tickets, ticket_keys=ticket_keys,
        api_keys=None if api_key is None else KeyRing.of([api_key.entry]),
    )
    try:
        return asyncio.run(_run(options, args, api_key))
    except TicketKeysError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return exit_codes.CONFIG
    except KeyboardInterrupt:
        return 130


def _say(message: str) -> None:
    print(f"[up] {message}", flush=True)


async def _run(options: Any, args: argparse.Namespace, api_key: NewKey | None) -> int:
    from scheduler.region.stack import LocalStack

    stack = LocalStack(options, say=_say)
    started = time.monotonic()
    try:
        await stack.start()
        _say(f"ready in {time.monotonic() - started:.0f} s")
        _say(f"router (gRPC)   {stack.router_target}")
        _say(f"router (HTTP)   {stack.router_http}  (OpenAI API: /v1/chat/completions, /v1/completions, "
             "/v1/models; SDK direct mode: http_url=...)")
        _say(f"API key         {api_key.key if api_key else 'none (--insecure)'}  (this run only; "
             "send it as `authorization: Bearer <key>`, SDK: api_key=...)")
        _say("regions (HTTP)  " + ", ".join(stack.endpoint(r.name) for r in stack.regions))
        _say(f"Ray dashboard   {stack.dashboard_url or 'off'}")
        _say(f"state           {stack.state_url} (namespace {stack.namespace})")
        if args.demo:
            return await _demo(stack, args.demo_requests, api_key.key if api_key else None)
        _say("serving; Ctrl-C to stop")
        await _until_signalled()
        return 0
    finally:
        _say("shutting down")
        await stack.stop()
        _say("stopped")


async def _until_signalled() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def _demo(stack: Any, requests: int, api_key: str | None) -> int:
    import httpx
    from tokenizers import Tokenizer

    from scheduler.region import dashboard, demo
    from scheduler.region.tiny_model import tiny_model_dir

    options = demo.DemoOptions(requests=requests, api_key=api_key)
    tokenizer = Tokenizer.from_file(str(tiny_model_dir() / "tokenizer.json"))
    trace = demo.build_requests(options, tokenizer)
    async with httpx.AsyncClient() as client:
        if stack.dashboard_url:
            apps = await dashboard.serve_applications(stack.dashboard_url, client)
            _say("Ray dashboard REST API, Serve applications: "
                 + ", ".join(f"{name} {status}" for name, status in sorted(apps.items())))
        outcomes, wall = await demo.replay(stack.router_target, trace, options, http_url=stack.router_http)
        probe = (await demo.probe_ttft(stack.router_target, tokenizer, options, http_url=stack.router_http)
                 if stack.ticket_keys else None)
        metrics: dict[str, float] = {}
        if stack.dashboard_url:
            metrics = await dashboard.metric_samples(stack.dashboard_url, client, "ray_scheduler_region_requests")
        power_caps = await demo.fetch_power_caps(stack.regions, stack.endpoint, client)
    print()
    print(f"Demo: {len(trace)} requests from the Azure LLM conversation trace (2023-11-16, CC-BY), "
          f"tokens x{options.token_scale}, arrivals x{options.time_scale}; model {demo.MODEL} "
          f"on tiny CPU stand-ins (energy: the model's estimate for the pools they stand for)")
    print(demo.report(outcomes, wall, probe, power_caps))
    if metrics:
        print("custom metrics as last exported by Ray (every ~10 s) to the targets the dashboard lists: "
              + ", ".join(f"{k} = {v:.0f}" for k, v in sorted(metrics.items())))
    print()
    failed = sum(1 for o in outcomes if o.error)
    if failed:
        _say(f"{failed} of {len(outcomes)} requests failed")
    return 1 if failed else 0
