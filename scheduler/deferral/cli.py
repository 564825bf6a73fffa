"""``scheduler deferred list|release``: the held deferrable requests in the shared store."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from datetime import UTC, datetime
from typing import Any


def register(sub: Any) -> None:
    deferred = sub.add_parser("deferred", help="deferrable requests held for a low-carbon window (docs/deferral.md)")
    actions = deferred.add_subparsers(dest="deferred_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the held requests, by release time")
    listing.add_argument("--tenant", default=None, help="only this tenant's")
    listing.add_argument("--json", action="store_true")
    release = actions.add_parser("release", help="release held requests now (the next tick of a router runs them)")
    release.add_argument("ids", nargs="*", metavar="REQUEST_ID")
    release.add_argument("--all", action="store_true", help="every held request (with --tenant: that tenant's)")
    release.add_argument("--tenant", default=None)
    for parser in (listing, release):
        parser.add_argument("--state", default=os.environ.get("SCHEDULER_STATE", "redis://127.0.0.1:6379/0"),
                            help="store URL: redis://HOST:PORT/DB or memory")
        parser.add_argument("--namespace", default=os.environ.get("SCHEDULER_NAMESPACE", "default"))
    listing.set_defaults(handler=_list)
    release.set_defaults(handler=_release)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _list(args: argparse.Namespace) -> int:
    return asyncio.run(_list_async(args))


def _release(args: argparse.Namespace) -> int:
    if not args.ids and not args.all:
        print("error: name REQUEST_ID(s) or --all", file=sys.stderr)
        return 2
    return asyncio.run(_release_async(args))


async def _list_async(args: argparse.Namespace) -> int:
    from scheduler.deferral.queue import DeferralQueue
    from scheduler.state.factory import open_store
    from scheduler.state.store import StateUnavailable

    store = open_store(args.state, args.namespace)
    try:
        queue = DeferralQueue(store)
        items = [i for i in await queue.held() if args.tenant is None or i.tenant == args.tenant]
        statuses = [await queue.status(i.request_id) for i in items]
    except StateUnavailable as exc:
        print(f"cannot read the deferral queue: the store at {args.state} is unreachable ({exc})", file=sys.stderr)
        return 1
    finally:
        await store.close()
    if args.json:
        print(json.dumps([
            {"request_id": i.request_id, "tenant": i.tenant, "status": s, "enqueued_at": i.enqueued_at,
             "release_at": i.release_at, "deadline": i.deadline, "reason": i.reason, "detail": i.detail,
             "region": i.region, "forecast_value": i.forecast_value, "now_value": i.now_value}
            for i, s in zip(items, statuses, strict=True)
        ], indent=2))
        return 0
    print(f"{'request':36s} {'tenant':12s} {'status':8s} {'release at':21s} {'deadline':21s} {'reason':12s} region")
    for i, s in zip(items, statuses, strict=True):
        print(f"{i.request_id:36s} {i.tenant:12s} {s:8s} {_when(i.release_at):21s} {_when(i.deadline):21s} "
              f"{i.reason:12s} {i.region}")
    print(f"{len(items)} held")
    return 0


async def _release_async(args: argparse.Namespace) -> int:
    from scheduler.deferral.queue import DeferralQueue
    from scheduler.state.factory import open_store
    from scheduler.state.store import StateUnavailable

    store = open_store(args.state, args.namespace)
    missing = []
    try:
        queue = DeferralQueue(store)
        ids = list(args.ids)
        if args.all:
            ids += [i.request_id for i in await queue.held() if args.tenant is None or i.tenant == args.tenant]
        for request_id in dict.fromkeys(ids):
            moved = await queue.release_now(request_id)
            if moved is None:
                missing.append(request_id)
            else:
                print(f"{request_id}: released at {_when(moved.release_at)} ({moved.detail})")
    except StateUnavailable as exc:
        print(f"cannot reach the deferral queue: the store at {args.state} is unreachable ({exc})", file=sys.stderr)
        return 1
    finally:
        await store.close()
    for request_id in missing:
        print(f"{request_id}: not held (already released, or unknown)", file=sys.stderr)
    return 1 if missing else 0
