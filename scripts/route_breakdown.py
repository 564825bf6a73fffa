#!/usr/bin/env python3
"""Where a live router's CPU goes on one direct-mode ``Route``: the bench's setup (two stub
regions, our router with ticket keys, memory state), the SDK's direct mode at concurrency 1
for ``--seconds``, and the router's own thread CPU time inside each step of the request,
measured in the router process while it serves.

    python scripts/route_breakdown.py [--seconds 10] [--repeat-schedule]

Each step is timed with ``time.thread_time_ns`` (CPU, not wall: a router preempted by the
client on the same core is not charged), so the figures add up to the router's CPU per
request from ``/proc`` less the event loop's own work. ``--repeat-schedule`` decides every
request two more times, right after the real decision and on the same inputs (the answers are
dropped): the first call runs on whatever the client and the regions left in the core's caches,
the repeats on the caches it warmed, which is the difference between a decision's cost in the
router (concurrency 1) and in ``scheduler bench decide`` (a loop).

The timers cost ~0.3 us each; the figures are for comparing steps, and the tree before and
after a change, in the same minute of the same host.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The steps, outermost first: (label, module, attribute path). ``transport.write`` is the
# socket write of the answer (a syscall: the kernel's loopback path is charged to the sender).
STEPS = (
    ("HTTP request (whole callback)", "scheduler.http.server", "_ServerConnection.data_received"),
    ("  Route handler", "scheduler.server.http_api", "HttpApi.route"),
    ("    decision + tickets", "scheduler.server.core", "RouterCore.route"),
    ("      decide", "scheduler.server.core", "RouterCore.decide"),
    ("        request conversion", "scheduler.server.convert", "incoming"),
    ("        Scheduler.schedule", "scheduler.framework.scheduler", "Scheduler.schedule"),
    ("        record the dispatch", "scheduler.datalayer.refresher", "SnapshotRefresher.record_dispatch"),
    ("    answer proto", "scheduler.server.core", "Routed.to_proto"),
    ("  socket write", "", "transport.write"),
)


def _inside(out_path: Path, repeat_schedule: bool, argv: list[str]) -> int:
    """In the router's process: wrap the steps, run the router, write the totals at exit."""
    import importlib

    totals: dict[str, list[int]] = {}
    clock = time.thread_time_ns

    def timed(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        entry = totals.setdefault(label, [0, 0])

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return function(*args, **kwargs)
            finally:
                entry[0] += clock() - start
                entry[1] += 1
        return wrapper

    def timed_async(label: str, function: Callable[..., Any]) -> Callable[..., Any]:
        # A handler that finishes without waiting (a Route) runs whole inside the first send.
        entry = totals.setdefault(label, [0, 0])

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return await function(*args, **kwargs)
            finally:
                entry[0] += clock() - start
                entry[1] += 1
        return wrapper

    originals: dict[str, Callable[..., Any]] = {}
    for label, module_name, path in STEPS:
        if not module_name:
            continue
        module = importlib.import_module(module_name)
        owner: Any = module
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        function = originals[path] = getattr(owner, name)
        wrap = timed_async if asyncio.iscoroutinefunction(function) else timed
        # (the core calls ``convert.incoming`` through its module: the module attribute is wrapped)
        setattr(owner, name, wrap(label, function))

    from scheduler.framework import scheduler as framework
    from scheduler.http import server as http_server

    if repeat_schedule:
        schedule, untimed = framework.Scheduler.schedule, originals["Scheduler.schedule"]
        again = totals.setdefault("        (the same decision again)", [0, 0])
        third = totals.setdefault("        (and a third time)", [0, 0])

        def schedule_and_repeat(self: Any, request: Any, snapshot: Any) -> Any:
            decision = schedule(self, request, snapshot)
            for entry in (again, third):
                start = clock()
                untimed(self, request, snapshot)
                entry[0] += clock() - start
                entry[1] += 1
            return decision
        framework.Scheduler.schedule = schedule_and_repeat  # type: ignore[method-assign]

    write_label = STEPS[-1][0]
    write_entry = totals.setdefault(write_label, [0, 0])

    class TimedTransport:
        def __init__(self, transport: Any) -> None:
            self._transport = transport

        def write(self, data: bytes) -> None:
            start = clock()
            try:
                self._transport.write(data)
            finally:
                write_entry[0] += clock() - start
                write_entry[1] += 1

        def __getattr__(self, name: str) -> Any:
            return getattr(self._transport, name)

    connection_made = http_server._ServerConnection.connection_made

    def timed_connection(self: Any, transport: Any) -> None:
        connection_made(self, transport)
        self.transport = TimedTransport(self.transport)
    http_server._ServerConnection.connection_made = timed_connection  # type: ignore[method-assign]

    def write_totals() -> None:
        out_path.write_text(json.dumps({"steps": totals, "process_cpu_s": time.process_time()}))
    atexit.register(write_totals)

    from scheduler.cli import main

    return main(argv)


async def _drive(setup: Any, seconds: float, warmup: int) -> dict[str, float]:
    from scheduler.bench.router import BENCH_MODEL, PROMPT, cpu_seconds
    from scheduler.client import AsyncSchedulerClient

    async with AsyncSchedulerClient(setup.router_target, timeout_s=30.0, http_url=setup.router_http) as sdk:
        async def one() -> None:
            async for _ in sdk.generate(PROMPT, model=BENCH_MODEL, max_tokens=16, mode="direct", timeout_s=30.0):
                pass

        for _ in range(warmup):
            await one()
        cpu0, wall0, count = cpu_seconds(setup.router_pid), time.perf_counter(), 0
        while time.perf_counter() - wall0 < seconds:
            await one()
            count += 1
        cpu = cpu_seconds(setup.router_pid) - cpu0
        return {"requests": count, "router_cpu_ms": cpu * 1e3 / count, "per_s": count / (time.perf_counter() - wall0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds (default 10)")
    parser.add_argument("--warmup", type=int, default=300, help="unmeasured requests first (default 300)")
    parser.add_argument("--repeat-schedule", action="store_true",
                        help="decide every request twice more on the same inputs (cold against warm caches)")
    parser.add_argument("--inside", type=Path, default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.inside is not None:
        return _inside(args.inside, args.repeat_schedule, rest)
    if args.seconds <= 0 or args.warmup < 0:
        print("--seconds must be positive and --warmup at least 0", file=sys.stderr)
        return 2

    from scheduler.bench.router import Processes, Settings, start_all

    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        out = work / "steps.json"
        entry = (str(Path(__file__).resolve()), "--inside", str(out)) + (
            ("--repeat-schedule",) if args.repeat_schedule else ())
        processes = Processes(work)
        try:
            setup = start_all(Settings(vllm_router=False, router_entry=entry), processes)
            measured = asyncio.run(_drive(setup, args.seconds, args.warmup))
        finally:
            processes.stop_all()
        if not out.exists():
            print("the router wrote no timings (it did not stop cleanly); its log:", file=sys.stderr)
            print(processes.workdir.joinpath("router.log").read_text(errors="replace")[-2000:], file=sys.stderr)
            return 1
        steps = json.loads(out.read_text())["steps"]
    print(f"direct mode, concurrency 1: {measured['requests']:,} Routes in {args.seconds:g} s "
          f"({measured['per_s']:,.0f}/s); router CPU per Route (/proc): {measured['router_cpu_ms'] * 1e3:,.1f} us")
    print(f"{'step (thread CPU, mean per call)':40s} {'us':>8s} {'calls':>9s}")
    order = [label for label, _, _ in STEPS]
    extra = [label for label in steps if label not in order]
    for label in order[:7] + extra + order[7:]:
        total_ns, calls = steps.get(label, (0, 0))
        if calls:
            print(f"{label:40s} {total_ns / calls / 1e3:8.1f} {calls:9,d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
