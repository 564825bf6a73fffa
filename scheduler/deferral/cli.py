"""``scheduler deferred list|release|purge``: the held deferrable requests in the shared store.

A request is named by its tenant and its id, so ``release`` of ids takes ``--tenant``. Every
action reads the queue's indexes (``scheduler.deferral.queue``), never the whole keyspace.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from scheduler.deferral.queue import DeferralQueue


def register(sub: Any) -> None:
    deferred = sub.add_parser("deferred", help="deferrable requests held for a low-carbon window (docs/deferral.md)")
    actions = deferred.add_subparsers(dest="deferred_command", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the held requests, by release time, and each tenant's use")
    listing.add_argument("--tenant", default=None, help="only this tenant's")
    listing.add_argument("--json", action="store_true")
    release = actions.add_parser("release", help="release held requests now (the next tick of a router runs them)")
    release.add_argument("ids", nargs="*", metavar="REQUEST_ID")
    release.add_argument("--all", action="store_true", help="every held request (with --tenant: that tenant's)")
    release.add_argument("--tenant", default=None, help="whose REQUEST_IDs (required with ids)")
    purge = actions.add_parser("purge", help="delete deferred requests and answers from the store (operators)")
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("--tenant", default=None,
                       help="everything of this tenant's: held requests (they never run), answers, cancellations")
    which.add_argument("--all-expired", action="store_true",
                       help="every tenant's held requests past their deadline and answers past their keep time")
    for parser in (listing, release, purge):
        parser.add_argument("--state", default=os.environ.get("SCHEDULER_STATE", "redis://127.0.0.1:6379/0"),
                            help="store URL: redis://HOST:PORT/DB or memory")
        parser.add_argument("--namespace", default=os.environ.get("SCHEDULER_NAMESPACE", "default"))
    listing.set_defaults(handler=_list)
    release.set_defaults(handler=_release)
    purge.set_defaults(handler=_purge)


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _on_queue(args: argparse.Namespace, action: Callable[[DeferralQueue], Awaitable[int]]) -> int:
    """Run ``action`` on the queue in the ``--state`` store; 1 when the store is unreachable."""
    from scheduler.state.factory import open_store
    from scheduler.state.store import StateUnavailable

    async def run() -> int:
        store = open_store(args.state, args.namespace)
        try:
            return await action(DeferralQueue(store))
        except StateUnavailable as exc:
            print(f"cannot reach the deferral queue: the store at {args.state} is unreachable ({exc})",
                  file=sys.stderr)
            return 1
        finally:
            await store.close()

    return asyncio.run(run())


def _list(args: argparse.Namespace) -> int:
    async def action(queue: DeferralQueue) -> int:
        items = await queue.held(args.tenant)
        statuses = [await queue.status(i.tenant, i.request_id) for i in items]
        tenants = [args.tenant] if args.tenant is not None else await queue.tenants()
        usage = {tenant: await queue.usage(tenant) for tenant in tenants}
        if args.json:
            print(json.dumps({
                "held": [{"request_id": i.request_id, "tenant": i.tenant, "status": s, "enqueued_at": i.enqueued_at,
                          "release_at": i.release_at, "deadline": i.deadline, "reason": i.reason,
                          "detail": i.detail, "region": i.region, "forecast_value": i.forecast_value,
                          "now_value": i.now_value} for i, s in zip(items, statuses, strict=True)],
                "usage": {tenant: {"held": held, "bytes": kept} for tenant, (held, kept) in usage.items()},
            }, indent=2))
            return 0
        print(f"{'request':36s} {'tenant':12s} {'status':8s} {'release at':21s} {'deadline':21s} {'reason':12s} "
              f"region")
        for i, s in zip(items, statuses, strict=True):
            print(f"{i.request_id:36s} {i.tenant:12s} {s:8s} {_when(i.release_at):21s} {_when(i.deadline):21s} "
                  f"{i.reason:12s} {i.region}")
        print(f"{len(items)} held")
        for tenant, (held, kept) in usage.items():
            print(f"tenant {tenant}: {held:,} held, {kept:,} bytes kept (held requests and answers)")
        return 0

    return _on_queue(args, action)


def _release(args: argparse.Namespace) -> int:
    if not args.ids and not args.all:
        print("error: name REQUEST_ID(s) (with --tenant) or --all", file=sys.stderr)
        return 2
    if args.ids and args.tenant is None:
        print("error: REQUEST_IDs are a tenant's: name it with --tenant", file=sys.stderr)
        return 2

    async def action(queue: DeferralQueue) -> int:
        named = [(args.tenant, request_id) for request_id in args.ids]
        if args.all:
            named += [(i.tenant, i.request_id) for i in await queue.held(args.tenant)]
        missing = []
        for tenant, request_id in dict.fromkeys(named):
            moved = await queue.release_now(tenant, request_id)
            if moved is None:
                missing.append(request_id)
            else:
                print(f"{request_id} ({tenant}): released at {_when(moved.release_at)} ({moved.detail})")
        for request_id in missing:
            print(f"{request_id}: not held (already released, or unknown)", file=sys.stderr)
        return 1 if missing else 0

    return _on_queue(args, action)


def _purge(args: argparse.Namespace) -> int:
    async def action(queue: DeferralQueue) -> int:
        if args.all_expired:
            print(f"purged {await queue.purge_expired():,} expired deferred requests and answers")
        else:
            print(f"purged {await queue.purge_tenant(args.tenant):,} deferred requests and answers of tenant "
                  f"{args.tenant}")
        return 0

    return _on_queue(args, action)
