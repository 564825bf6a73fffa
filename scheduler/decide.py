"""``scheduler route --explain`` and ``scheduler bench decide``: one decision (or many) from the
configured fleet and the shipped carbon data, through the same ``Scheduler`` the router runs.

Above the framework, the plugins and the data layer (it uses all three), so none of them
imports it."""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import ConfigError
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, CarbonCsvError
from scheduler.datalayer.offline import csv_carbon_bounds, csv_carbon_signals, zone_series
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.explain import explain_dict, explain_table
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.types import WORKLOAD_CLASSES, FleetSnapshot, GeoPoint, Request


def _time(value: str) -> float:
    if value == "now":
        return time.time()
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO time like 2026-06-01T12:00Z or 'now', got {value!r}") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _location(value: str) -> GeoPoint:
    try:
        lat, lon = (float(part) for part in value.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAT,LON like 48.85,2.35, got {value!r}") from None
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        raise argparse.ArgumentTypeError(f"latitude/longitude out of range: {value!r}")
    return GeoPoint(lat, lon)


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value!r}")
    return number


def register(sub: Any) -> None:
    route = sub.add_parser("route", help="decide where one request would run, and explain why")
    route.add_argument("--explain", action="store_true", help="show candidates, scores, rejections, fallbacks")
    route.add_argument("--json", action="store_true", help="print the explanation as JSON")
    add_config_dirs(route)
    route.add_argument("--policy", default="default")
    route.add_argument("--at", type=_time, default="now", help="decision time (ISO 8601, UTC) or 'now'")
    route.add_argument("--carbon-dir", type=Path, default=SHIPPED_CARBON_DIR, help="hourly carbon CSV folder")
    route.add_argument("--carbon-age", type=float, default=None, metavar="SECONDS",
                       help="make the carbon signals this old (as if the feed stopped then)")
    route.add_argument("--model", default="llama-3.1-8b")
    route.add_argument("--prompt-tokens", type=_positive_int, default=512)
    route.add_argument("--max-tokens", type=_positive_int, default=256)
    route.add_argument("--cached-tokens", type=int, default=0)
    route.add_argument("--jurisdiction", action="append", default=[], help="allowed jurisdiction (repeatable)")
    route.add_argument("--certification", action="append", default=[], help="required certification (repeatable)")
    route.add_argument("--client-location", type=_location, default=None, metavar="LAT,LON")
    route.add_argument("--ttft-ms", type=float, default=None)
    route.add_argument("--tpot-ms", type=float, default=None)
    route.add_argument("--workload-class", choices=WORKLOAD_CLASSES, default="interactive")
    route.add_argument("--precision", default=None)
    route.add_argument("--task-class", default=None)
    route.add_argument("--seed", type=int, default=0, help="seed of the tie-break salt (orders exact ties)")
    route.add_argument("--state", metavar="URL",
                       help="decide on what the routers see now: the regions' live state and the carbon signals "
                            "in this store (redis://...; --at and --carbon-* then do not apply)")
    route.add_argument("--namespace", default="default", help="with --state: the store's key namespace")
    route.set_defaults(handler=_route)


def register_bench(bench: Any) -> None:
    decide = bench.add_parser("decide", help="p50/p99 of Scheduler.schedule() on the default and a 12x4 fleet")
    decide.add_argument("--requests", type=_positive_int, default=20000)
    decide.add_argument("--seed", type=int, default=0)
    decide.set_defaults(handler=_bench_decide)


def _route(args: argparse.Namespace) -> int:
    try:
        fleet = load_checked_fleet(args.regions, args.policies)
        policy = fleet.policy(args.policy)
        series = zone_series(fleet.regions, args.carbon_dir)
        carbon = csv_carbon_signals(fleet.regions, args.at, args.carbon_dir, args.carbon_age, series)
        bounds = csv_carbon_bounds(fleet.regions, args.at, policy.stale_bounds.carbon_window, args.carbon_dir,
                                   args.carbon_age, series)
    except (ConfigError, CarbonCsvError) as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    request = Request(
        request_id="explain",
        model=args.model,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
        cached_tokens=args.cached_tokens,
        workload_class=args.workload_class,
        ttft_slo_ms=args.ttft_ms,
        tpot_slo_ms=args.tpot_ms,
        allowed_jurisdictions=frozenset(j.upper() for j in args.jurisdiction),
        required_certifications=frozenset(args.certification),
        precision=args.precision,
        task_class=args.task_class,
        client_location=args.client_location,
    )
    builder = SnapshotBuilder(compile_fleet(fleet.regions), compile_policy(policy))
    try:
        snapshot = asyncio.run(_live_snapshot(builder, args.state, args.namespace)) if args.state else \
            builder.build(args.at, carbon=carbon, carbon_bounds=bounds)
    except RuntimeError as exc:  # the store of --state cannot be read
        print(exc, file=sys.stderr)
        return exit_codes.FAILURE
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(args.seed))
    decision = scheduler.schedule(request, snapshot)
    if args.json:
        print(json.dumps(explain_dict(decision), indent=2))
    elif args.explain:
        print(explain_table(decision))
    else:
        chosen = decision.chosen
        print("unschedulable" if chosen is None else f"{chosen.candidate.region.name}/{chosen.candidate.pool.name}")
    return exit_codes.OK if decision.schedulable else exit_codes.UNSCHEDULABLE


async def _live_snapshot(builder: SnapshotBuilder, url: str, namespace: str) -> FleetSnapshot:
    """The snapshot a router sharing this store builds now (live states, pools served, signals)."""
    from scheduler.datalayer.refresher import SnapshotRefresher
    from scheduler.state.factory import open_store

    store = open_store(url, namespace)
    try:
        refresher = SnapshotRefresher(builder, store)
        snapshot = await refresher.refresh()
        if refresher.status.last_error:
            raise RuntimeError(f"--state {url}: the store cannot be read: {refresher.status.last_error}")
        return snapshot
    finally:
        await store.close()


def _bench_requests(rng: random.Random, n: int, models: tuple[str, ...]) -> list[Request]:
    cities = [GeoPoint(48.85, 2.35), GeoPoint(40.71, -74.0), GeoPoint(35.68, 139.69), GeoPoint(37.77, -122.42),
              GeoPoint(1.35, 103.82), GeoPoint(52.52, 13.40), GeoPoint(-33.87, 151.21), None]
    requests = []
    for i in range(n):
        eu_only = rng.random() < 0.15
        requests.append(
            Request(
                request_id=f"bench-{i}",
                model=models[0] if rng.random() < 0.8 else rng.choice(models),
                prompt_tokens=int(rng.lognormvariate(6.5, 1.2)) + 1,
                max_tokens=rng.choice((64, 128, 256, 512, 1024)),
                workload_class="interactive" if rng.random() < 0.8 else "batch",
                allowed_jurisdictions=frozenset({"EU"}) if eu_only else frozenset(),
                client_location=rng.choice(cities),
            )
        )
    return requests


def _measure(name: str, regions: tuple[RegionConfig, ...], policy: PolicyConfig, n: int, seed: int) -> dict[str, Any]:
    at = datetime(2026, 6, 1, 12, tzinfo=UTC).timestamp()
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy))
    snapshot: FleetSnapshot = builder.build(at, carbon=csv_carbon_signals(regions, at))
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(seed))
    models = tuple(sorted({c.deployment.name for c in snapshot.candidates}))
    requests = _bench_requests(random.Random(seed), n, ("llama-3.1-8b", *models))
    for request in requests[:500]:  # warm caches (RTT memo) as a long-running router would have them
        scheduler.schedule(request, snapshot)
    samples = []
    clock = time.perf_counter_ns
    for request in requests:
        start = clock()
        scheduler.schedule(request, snapshot)
        samples.append(clock() - start)
    samples.sort()
    return {
        "fleet": name,
        "regions": len(regions),
        "candidates": len(snapshot.candidates),
        "requests": n,
        "p50_us": samples[n // 2] / 1e3,
        "p99_us": samples[int(n * 0.99)] / 1e3,
        "mean_us": statistics.fmean(samples) / 1e3,
    }


def _bench_decide(args: argparse.Namespace) -> int:
    from scheduler.config.synthetic import synthetic_fleet

    fleet = load_checked_fleet()
    policy = fleet.policy("default")
    rows = [
        _measure("default", fleet.regions, policy, args.requests, args.seed),
        _measure("generated 12x4", synthetic_fleet(12, 4, args.seed), policy, args.requests, args.seed),
    ]
    print(f"{'fleet':<16} {'regions':>7} {'candidates':>10} {'requests':>9} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}")
    for r in rows:
        print(f"{r['fleet']:<16} {r['regions']:>7} {r['candidates']:>10} {r['requests']:>9} "
              f"{r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['mean_us']:>8.1f}")
    return 0
