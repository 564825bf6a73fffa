"""A router-like process for the multi-process poller test: it runs ``CarbonPollers`` on a
shared Redis for one Electricity Maps zone and, every 0.1 s, prints one JSON line with what
it holds, how often it polled, and the signal it reads back from the store (what its
snapshot would use). Run: ``python -m tests.integration.carbon.router_like --help``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys

from scheduler.config.loader import load_fleet
from scheduler.config.schema import CarbonSource
from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
from scheduler.datalayer.carbon.providers import ProviderOptions
from scheduler.datalayer.carbon.store_io import read_signal
from scheduler.datalayer.carbon.zone_poller import LockTiming
from scheduler.state import codec
from scheduler.state.redis_store import RedisStore
from scheduler.wire.retry import RetryPolicy


async def main(args: argparse.Namespace) -> None:
    region = load_fleet().regions[0]
    region = region.model_copy(update={
        "carbon": CarbonSource(provider="electricitymaps", zone=args.zone, poll_interval_s=args.interval)})
    store = RedisStore.from_url(args.redis, args.namespace)
    options = ProviderOptions(base_url=args.base_url, env={"ELECTRICITYMAPS_API_KEY": args.key}, timeout_s=1.0,
                              retry=RetryPolicy(attempts=1))
    pollers = CarbonPollers.from_regions([region], store, options=options,
                                         lock=LockTiming(ttl_s=args.ttl, contend_s=args.contend))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await pollers.start()
    while not stop.is_set():
        found = await read_signal(store, args.zone)
        line = {
            "pid": os.getpid(),
            "holding": pollers.holding(),
            "polls": pollers.counters.value(metrics.POLLS),
            "signal": json.loads(codec.encode_signal(found)) if found else None,
        }
        print(json.dumps(line), flush=True)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)
    await pollers.stop()
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("--redis", "--namespace", "--base-url", "--zone", "--key"):
        parser.add_argument(name, required=True)
    parser.add_argument("--ttl", type=float, default=2.0)
    parser.add_argument("--contend", type=float, default=0.1)
    parser.add_argument("--interval", type=float, default=0.5)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
