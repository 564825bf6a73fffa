"""``scheduler ledger show --tenant T [--month YYYY-MM] [--state URL]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from scheduler.units import J_PER_KWH


def register(sub: Any) -> None:
    ledger = sub.add_parser("ledger", help="tenant energy and carbon ledger")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    show = ledger_sub.add_parser("show", help="a tenant's month by region and attribution rule")
    show.add_argument("--tenant", required=True)
    show.add_argument("--month", default=None, help="YYYY-MM (default: this UTC month)")
    show.add_argument("--state", default=os.environ.get("SCHEDULER_STATE", "redis://127.0.0.1:6379/0"),
                      help="store URL: redis://HOST:PORT/DB or memory")
    show.add_argument("--namespace", default=os.environ.get("SCHEDULER_NAMESPACE", "default"))
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    return asyncio.run(_show_async(args))


async def _show_async(args: argparse.Namespace) -> int:
    from scheduler.ledger.ledger import Ledger
    from scheduler.state.factory import open_store

    store = open_store(args.state, args.namespace)
    try:
        ledger = Ledger(store)
        usage, stale = await ledger.usage(args.tenant, args.month)
    finally:
        await store.close()
    if stale:
        print(f"cannot read the ledger: the store at {args.state} is unreachable", file=sys.stderr)
        return 1
    rows = sorted(usage.by_region.items())
    if args.json:
        print(json.dumps({
            "tenant": usage.tenant, "month": usage.month, "energy_j": usage.energy_j, "carbon_g": usage.carbon_g,
            "requests": usage.requests, "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "by_region": [{"region": r, "rule_version": v, **values} for (r, v), values in rows],
        }))
        return 0
    print(f"tenant {usage.tenant}, {usage.month}")
    print(f"{'region':16s} {'rule':12s} {'energy kWh':>12s} {'energy J':>14s} {'gCO2e':>12s} {'requests':>10s} "
          f"{'prompt tok':>12s} {'output tok':>12s}")
    for (region, rule), v in rows:
        print(f"{region:16s} {rule:12s} {v['energy_j'] / J_PER_KWH:12.4f} {v['energy_j']:14.1f} "
              f"{v['carbon_g']:12.2f} {v['requests']:10.0f} {v['prompt_tokens']:12.0f} {v['completion_tokens']:12.0f}")
    print(f"{'total':16s} {'':12s} {usage.energy_j / J_PER_KWH:12.4f} {usage.energy_j:14.1f} "
          f"{usage.carbon_g:12.2f} {usage.requests:10.0f} {usage.prompt_tokens:12.0f} {usage.completion_tokens:12.0f}")
    return 0
