"""The fault suite's harness: a router (real gRPC server on port 0) with its ledger and audit
on a private Redis, stub regions (real HTTP servers) that publish their live state the way a
region does, a load of SDK clients, and the accounting every scenario prints:

    scenario | requests | lost before the first token | errors (by code) | ledger lost | ledger doubled

- *lost before the first token*: a request the client gave up on without ever receiving text
  (the SDK retries UNAVAILABLE before the first token, as users run it).
- *ledger lost / doubled*: for every stream the router started (a receipt booked, partial
  ones included), the ledger must count exactly one request and the audit stream must hold
  exactly one entry with its decision id; and every stream a client received text on must be
  among them.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import grpc

from scheduler.client import AsyncSchedulerClient, SchedulerRpcError
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import CarbonSource, RegionConfig
from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
from scheduler.datalayer.carbon.providers import ProviderOptions
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.ledger.ledger import Ledger
from scheduler.server.app import RouterDeps, RunningRouter, build_deps, start_router, with_services
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.state import codec, keys
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import StateUnavailable
from scheduler.tasks import stop_task
from scheduler.types import EnergyReceipt, PoolLiveState, RegionLiveState
from scheduler.wire.retry import RetryPolicy

REGIONS = ("eu-north", "eu-central", "us-east")
TENANT = "local"  # the router runs without keys here: every caller is the local tenant
MODEL = "llama-3.1-8b"


@dataclass
class Tally:
    """What the clients saw."""

    requests: int = 0
    completed: int = 0
    lost_before_first_token: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    # decision ids of the streams on which the client received text
    started: set[str] = field(default_factory=set)
    # decisions answered, by the signals they fell back on ("" when none), and any ranked
    # candidate whose cost was not a finite number
    fallbacks: Counter[str] = field(default_factory=Counter)
    non_finite_costs: int = 0


@dataclass
class Books:
    """What the router booked (a receipt sink) and what reached the store."""

    booked: Counter[str] = field(default_factory=Counter)
    partial: int = 0

    def sink(self, receipt: EnergyReceipt) -> None:
        self.booked[receipt.decision_id] += 1
        self.partial += bool(getattr(receipt, "partial", False))


@dataclass
class Row:
    scenario: str
    requests: int
    lost_before_first_token: int
    errors: dict[str, int]
    ledger_lost: int
    ledger_doubled: int
    audit_lost: int
    audit_doubled: int
    partial_receipts: int
    note: str = ""

    def line(self) -> str:
        errors = ", ".join(f"{code} {n}" for code, n in sorted(self.errors.items())) or "none"
        return (f"| {self.scenario} | {self.requests} | {self.lost_before_first_token} | {errors} | "
                f"{self.ledger_lost} | {self.ledger_doubled} | {self.audit_lost}/{self.audit_doubled} | "
                f"{self.partial_receipts} | {self.note} |")


# Rows of the scenarios run in this session; printed in the terminal summary (tests/conftest.py).
REPORT: list[Row] = []
# Figures of the fault tests that are not rows of the table (test: lines), printed after it.
FIGURES: dict[str, list[str]] = {}

HEADER = ("| scenario | requests | lost before first token | errors (code n) | ledger lost | ledger doubled | "
          "audit lost/doubled | partial receipts | note |")


@dataclass
class Stack:
    """Stub regions + a router over them, on ``store``; regions publish their live state."""

    store_url: str
    namespace: str
    stub_settings: Callable[[str], StubRegionSettings] = lambda name: StubRegionSettings(name=name)
    # Set: every region's carbon comes from Electricity Maps at this URL (a test server),
    # polled by the router every 0.3 s with this key.
    carbon_api: tuple[str, str] | None = None
    regions: dict[str, StubRegion] = field(default_factory=dict)
    configs: tuple[RegionConfig, ...] = ()
    router: RunningRouter | None = None
    books: Books = field(default_factory=Books)
    port: int = 0
    _publishing: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _stores: list[RedisStore] = field(default_factory=list)

    async def start(self) -> Stack:
        shipped = {r.name: r for r in load_fleet().regions}
        for name in REGIONS:
            self.regions[name] = await StubRegion(self.stub_settings(name)).start()
        self.configs = tuple(shipped[n].model_copy(update={"endpoint": self.regions[n].endpoint}) for n in REGIONS)
        if self.carbon_api is not None:
            self.configs = tuple(c.model_copy(update={"carbon": CarbonSource(
                provider="electricitymaps", zone=c.grid_zone, poll_interval_s=0.3)}) for c in self.configs)
        for config in self.configs:
            self._publishing[config.name] = asyncio.create_task(self._publish(config))
        await self.start_router()
        return self

    async def start_router(self) -> RunningRouter:
        store = RedisStore.from_url(self.store_url, self.namespace, timeout_s=1.0, connect_timeout_s=0.5)
        deps: RouterDeps = build_deps(SnapshotBuilder(compile_fleet(self.configs),
                                                      compile_policy(load_fleet().policy("default"))), store, "redis",
                                      rate_limit_rps=1e6)
        with_services(deps, carbon_pollers=False, budgets={})
        if self.carbon_api is not None:
            url, key = self.carbon_api
            options = ProviderOptions(base_url=url, env={"ELECTRICITYMAPS_API_KEY": key}, timeout_s=0.5,
                                      retry=RetryPolicy(attempts=1))
            deps.background.append(CarbonPollers.from_regions(self.configs, store, options=options))
        deps.receipt_sinks.append(self.books.sink)
        self.router = await start_router(f"127.0.0.1:{self.port}", deps)
        self.port = self.router.port
        return self.router

    async def stop_router(self, grace_s: float) -> None:
        router, self.router = self.router, None
        if router is not None:
            await router.stop(grace_s=grace_s)

    async def _publish(self, config: RegionConfig) -> None:
        """What a region's publisher does: its live state every 0.5 s with a TTL."""
        store = RedisStore.from_url(self.store_url, self.namespace, timeout_s=1.0, connect_timeout_s=0.5)
        self._stores.append(store)
        pools = {p.name: PoolLiveState(running=1) for p in config.pools}
        while True:
            state = RegionLiveState(config.name, True, time.time(), pools)
            with contextlib.suppress(StateUnavailable):
                await store.set(keys.region_state(config.name), codec.encode_region_state(state), ttl_s=30.0)
            await asyncio.sleep(0.5)

    async def kill_region(self, name: str) -> None:
        """The region dies: its streams are cut and it stops publishing."""
        await stop_task(self._publishing.pop(name))
        await self.regions[name].stop()

    async def stop(self) -> None:
        """Everything down, each step bounded: a scenario's teardown must not outlive its test."""
        await asyncio.wait_for(self.stop_router(grace_s=1.0), 30)
        for task in self._publishing.values():
            await asyncio.wait_for(stop_task(task), 10)
        for stub in self.regions.values():
            await asyncio.wait_for(stub.stop(), 10)
        for store in self._stores:
            await asyncio.wait_for(store.close(), 5)


async def client_load(port: int, tally: Tally, stop: asyncio.Event, workers: int = 8, max_tokens: int = 8,
                      timeout_s: float = 15.0) -> None:
    """``workers`` SDK clients sending Generate requests back to back until ``stop`` is set."""

    async def worker(index: int) -> None:
        retry = RetryPolicy(attempts=8, initial_backoff_s=0.1, max_backoff_s=1.0)
        async with AsyncSchedulerClient(f"127.0.0.1:{port}", timeout_s=timeout_s, retry=retry) as client:
            n = 0
            while not stop.is_set():
                n += 1
                tally.requests += 1
                generation = client.generate(f"fault suite worker {index} request {n}", model=MODEL,
                                             max_tokens=max_tokens, workload_class="batch")
                got_text = False
                try:
                    async for _ in generation:
                        if not got_text and generation.decision is not None:
                            tally.started.add(generation.decision.decision_id)
                        got_text = True
                    tally.completed += 1
                    decision = generation.decision
                    if decision is not None:
                        tally.fallbacks[",".join(sorted({f.signal for f in decision.fallbacks}))] += 1
                        tally.non_finite_costs += sum(1 for r in decision.ranked if not math.isfinite(r.total))
                except SchedulerRpcError as exc:
                    tally.errors[exc.code.name] += 1
                    if not got_text:
                        tally.lost_before_first_token += 1
                except grpc.aio.AioRpcError as exc:
                    tally.errors[exc.code().name] += 1
                    if not got_text:
                        tally.lost_before_first_token += 1

    await asyncio.gather(*(worker(i) for i in range(workers)))


async def ledger_and_audit(store_url: str, namespace: str) -> tuple[int, Counter[str]]:
    """Requests the ledger counts for the tenant this month, and audit entries per decision id."""
    store = RedisStore.from_url(store_url, namespace)
    try:
        usage, _ = await Ledger(store).usage(TENANT)
        audit: Counter[str] = Counter()
        after = None
        while True:
            entries = await store.xrange(keys.AUDIT, 1000, after=after)
            if not entries:
                break
            for entry_id, fields in entries:
                audit[fields.get("decision_id", "")] += 1
                after = entry_id
        return int(usage.requests), audit
    finally:
        await store.close()


async def account(scenario: str, stack: Stack, tally: Tally, note: str = "") -> Row:
    """Stop the router (its ledger and audit flush), then compare what it booked with the store."""
    await stack.stop_router(grace_s=2.0)
    ledger_requests, audit = await ledger_and_audit(stack.store_url, stack.namespace)
    booked = stack.books.booked
    booked_ids = set(booked)
    # Every stream a client got text from was booked; booked ones are the ones to find.
    unbooked_seen = len(tally.started - booked_ids)
    expected = len(booked_ids)
    row = Row(
        scenario=scenario,
        requests=tally.requests,
        lost_before_first_token=tally.lost_before_first_token,
        errors=dict(tally.errors),
        ledger_lost=max(0, expected - ledger_requests) + unbooked_seen,
        ledger_doubled=max(0, ledger_requests - expected) + sum(n - 1 for n in booked.values() if n > 1),
        audit_lost=sum(1 for d in booked_ids if audit[d] == 0),
        audit_doubled=sum(audit[d] - 1 for d in booked_ids if audit[d] > 1),
        partial_receipts=stack.books.partial,
        note=note,
    )
    print(f"\n{HEADER}\n{row.line()}")
    return row


@contextlib.asynccontextmanager
async def running(stack: Stack) -> AsyncIterator[Stack]:
    await stack.start()
    try:
        yield stack
    finally:
        await stack.stop()
