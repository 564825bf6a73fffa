"""``scheduler signals fetch`` (ask one provider now) and ``scheduler signals show`` (what the
store holds, with ages, stale ones marked)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.schema import CARBON_PROVIDERS
from scheduler.types import Signal

DEFAULT_STATE = "redis://127.0.0.1:6379/0"


def register(sub: Any) -> None:
    signals = sub.add_parser("signals", help="carbon signals: ask a provider, or list what the store holds")
    signals_sub = signals.add_subparsers(dest="signals_command", required=True, metavar="ACTION")

    fetch = signals_sub.add_parser("fetch", help="fetch one zone from one provider now and print the signals")
    fetch.add_argument("--provider", required=True, choices=CARBON_PROVIDERS)
    fetch.add_argument("--zone", required=True, help="the provider's zone / region / location name")
    fetch.add_argument("--base-url", help="the provider's API root (default: its env var or public URL)")
    fetch.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request (default 10)")
    fetch.add_argument("--history", action="store_true", help="the last ~24 h instead of latest + forecast")
    fetch.add_argument("--json", action="store_true", help="a JSON array of signal objects")
    fetch.set_defaults(handler=_fetch)

    show = signals_sub.add_parser("show", help="the signals in the store, their ages, stale ones marked")
    show.add_argument("--state", default=os.environ.get("SCHEDULER_STATE", DEFAULT_STATE),
                      help=f"'memory' or redis://HOST:PORT/DB (default $SCHEDULER_STATE or {DEFAULT_STATE})")
    show.add_argument("--namespace", default=os.environ.get("SCHEDULER_NAMESPACE", "default"))
    show.add_argument("--policy", default="default",
                      help="policy name (in --policies) or a policy YAML file whose max_age.carbon marks stale")
    show.add_argument("--policies", type=Path, default=None, help="folder of policy YAML files")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_show)


def signal_json(signal: Signal, now: float | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"zone": signal.key, **asdict(signal)}
    del body["key"]
    if now is not None:
        body["age_s"] = round(now - signal.observed_at, 1)
    return body


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _fetch(args: argparse.Namespace) -> int:
    return asyncio.run(_fetch_async(args))


async def _fetch_async(args: argparse.Namespace) -> int:
    from scheduler.datalayer.carbon.base import Fetched
    from scheduler.datalayer.carbon.errors import ProviderError
    from scheduler.datalayer.carbon.providers import ProviderOptions, make_provider

    provider = make_provider(args.provider, ProviderOptions(base_url=args.base_url, timeout_s=args.timeout))
    try:
        if args.history:
            try:
                fetched = Fetched(latest=tuple(await provider.history(args.zone)))
            except ProviderError as exc:
                fetched = Fetched(failures=(exc,))
        else:
            fetched = await provider.fetch(args.zone)
    finally:
        await provider.aclose()
    for failure in fetched.failures:
        print(f"error: {failure}", file=sys.stderr)
    signals = [*fetched.latest, *fetched.forecast]
    now = time.time()
    if args.json:
        print(json.dumps([signal_json(s) for s in signals], indent=2))
    else:
        for s in signals:
            flags = ",".join(n for n, on in (("forecast", s.is_forecast), ("estimated", s.is_estimated)) if on)
            print(f"{s.kind:<17} {s.key:<14} {s.value:>9.2f} {s.unit:<11} observed {_iso(s.observed_at)} "
                  f"({_age(now - s.observed_at)} ago) {flags:<18} {s.source}")
    return 0 if fetched.latest else 1


def _show(args: argparse.Namespace) -> int:
    from scheduler.config.loader import ConfigError, load_policy
    from scheduler.plugins.checked_fleet import load_checked_fleet

    try:
        if args.policy.endswith((".yaml", ".yml")):
            policy = load_policy(Path(args.policy))
        else:
            policy = load_checked_fleet(policies_dir=args.policies).policy(args.policy)
    except ConfigError as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        return exit_codes.CONFIG
    return asyncio.run(_show_async(args, policy.max_age.carbon, policy.name))


async def _show_async(args: argparse.Namespace, max_age_s: float, policy: str) -> int:
    from scheduler.datalayer.carbon.store_io import list_signals, read_forecast
    from scheduler.state.factory import open_store
    from scheduler.state.store import StateUnavailable

    store = open_store(args.state, args.namespace)
    try:
        found = await list_signals(store)
        forecasts = {s.key: await read_forecast(store, s.key) for _, s in found if s is not None}
    except StateUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    now = time.time()
    rows: list[dict[str, Any]] = []
    for key, s in found:
        if s is None:
            rows.append({"key": key, "error": "undecodable record"})
            continue
        body = signal_json(s, now)
        body["stale"] = now - s.observed_at > max_age_s
        body["forecast_points"] = len(forecasts.get(s.key, []))
        rows.append(body)
    if args.json:
        print(json.dumps({"policy": policy, "max_age_s": max_age_s, "signals": rows}, indent=2))
        return 0
    print(f"{len(rows)} signal(s) in {args.state} namespace {args.namespace}; stale after {_age(max_age_s)} "
          f"(policy {policy})")
    for row in rows:
        if "error" in row:
            print(f"  {row['key']}: {row['error']}")
            continue
        mark = "STALE" if row["stale"] else "ok"
        print(f"  {mark:<5} {row['kind']:<17} {row['zone']:<14} {row['value']:>9.2f} {row['unit']:<11} "
              f"age {_age(row['age_s']):>6}  observed {_iso(row['observed_at'])}  {row['source']}"
              f"  forecast {row['forecast_points']} pts")
    return 0
