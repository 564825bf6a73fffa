"""Pollers shared through the real Redis (DB 2): two router-like processes, one poller per
provider and zone, the lock handed over when its holder is killed; and the decision a router
makes once the provider is down and the signal's age passes the policy's limit."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import redis

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import CarbonSource
from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
from scheduler.datalayer.carbon.providers import ProviderOptions
from scheduler.datalayer.carbon.store_io import read_carbon, read_signal
from scheduler.datalayer.carbon.zone_poller import LockTiming
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.types import PoolLiveState, RegionLiveState, Request
from scheduler.wire.retry import RetryPolicy
from tests.integration.carbon.carbon_apis import ElectricityMapsApi
from tests.integration.carbon.conftest import REDIS_URL

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
KEY = "em-secret"
TTL_S = 2.0
CONTEND_S = 0.1


def hour_start(t: float) -> float:
    return t - t % 3600.0


class RouterProcess:
    """A router-like subprocess (``router_like.py``) and the last state line it printed."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.state: dict = {}
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.state = json.loads(raw)

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()  # our own child, by its handle
                await self.proc.wait()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)


async def start_router(namespace: str, base_url: str) -> RouterProcess:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.carbon.router_like", "--redis", REDIS_URL,
        "--namespace", namespace, "--base-url", base_url, "--zone", "DE", "--key", KEY,
        "--ttl", str(TTL_S), "--contend", str(CONTEND_S), "--interval", "0.5",
        cwd=ROOT, stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return RouterProcess(proc)


async def wait_for(condition, timeout_s: float) -> float:
    """Seconds until ``condition()`` held."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout_s, "condition not met in time"
        await asyncio.sleep(0.02)
    return time.monotonic() - start


@pytest.mark.timeout(90)
async def test_two_router_processes_one_poller_and_takeover_when_it_dies(serve, redis_store):
    observed = hour_start(time.time())
    api = ElectricityMapsApi(KEY, {"DE": (300.0, observed)})
    server = serve(api)
    routers = [await start_router(redis_store.namespace, server.url) for _ in range(2)]
    try:
        await wait_for(lambda: all(r.state.get("signal") for r in routers), timeout_s=30)
        await asyncio.sleep(2.0)  # about four poll intervals
        holders = [r for r in routers if r.state["holding"]]
        assert len(holders) == 1, [r.state for r in routers]
        holder, other = holders[0], next(r for r in routers if r is not holders[0])
        assert holder.state["polls"] >= 3 and other.state["polls"] == 0
        latest_requests = sum(1 for s in server.seen if s.path.endswith("/latest"))
        assert abs(latest_requests - holder.state["polls"]) <= 1
        # Both decide with the same signal (``fetched_at`` moves on with every poll, between
        # the two processes' reads; what a decision uses does not).
        def used(state: dict) -> dict:
            return {k: v for k, v in state["signal"].items() if k != "fetched_at"}

        assert used(holder.state) == used(other.state)
        assert holder.state["signal"]["value"] == 300.0 and holder.state["signal"]["observed_at"] == observed

        lock_key = f"sched:{redis_store.namespace}:lock:carbon:electricitymaps:DE"
        raw = redis.Redis.from_url(REDIS_URL)
        try:
            left_s = raw.pttl(lock_key) / 1000.0  # what the holder's last renewal left
            os.kill(holder.pid, signal.SIGKILL)  # the holder dies without releasing its lock
        finally:
            raw.close()
        took_over_s = await wait_for(lambda: bool(other.state.get("holding")), timeout_s=TTL_S + 5)
        print(f"\nlock handed over {took_over_s:.2f} s after the holder was killed; the lock had {left_s:.2f} s "
              f"of its {TTL_S} s TTL left")
        assert 0 < left_s <= TTL_S
        # Never taken while the dead holder's lock still stands (two pollers at once)...
        assert took_over_s >= left_s - 0.05
        # ...and taken once it lapses. The holder may have renewed between our PTTL read and the
        # kill (then a whole TTL stood), and the other process reports every 0.1 s on a host
        # that may be busy: hence a whole TTL, one contention period, and a second of slack.
        assert took_over_s <= TTL_S + CONTEND_S + 1.0

        # The provider publishes a newer value (dated now: a value dated in the future would
        # be rejected at ingest, see test_carbon_ingest.py).
        api.values["DE"] = (250.0, time.time())
        await wait_for(lambda: (other.state.get("signal") or {}).get("value") == 250.0, timeout_s=5)
        assert other.state["polls"] >= 1
    finally:
        for router in routers:
            await router.stop()


def eu_regions():
    fleet = load_fleet()
    regions = [r for r in fleet.regions if r.name in ("eu-central", "eu-north")]
    return fleet.policy("default"), [
        r.model_copy(update={"carbon": CarbonSource(provider="electricitymaps", zone=r.grid_zone,
                                                     poll_interval_s=0.3)})
        for r in regions
    ]


def decide(builder: SnapshotBuilder, carbon, now: float):
    request = Request(request_id="r-1", model="llama-3.1-8b", prompt_tokens=800, max_tokens=200,
                      allowed_jurisdictions=frozenset({"EU"}))
    # Every region published its live state just now: only carbon can be stale here.
    live = {r.name: RegionLiveState(r.name, True, now, {p.name: PoolLiveState(running=4) for p in r.pools})
            for r in builder.regions}
    scheduler = Scheduler.from_registry(default_scheduler_registry())
    return scheduler.schedule(request, builder.build(now=now, carbon=carbon, live=live))


@pytest.mark.timeout(60)
async def test_provider_down_decision_falls_back_with_the_true_age(serve, redis_store):
    policy, regions = eu_regions()
    observed = hour_start(time.time())
    api = ElectricityMapsApi(KEY, {"DE-LU": (450.0, observed), "NO": (30.0, observed)})
    server = serve(api)
    options = ProviderOptions(base_url=server.url, env={"ELECTRICITYMAPS_API_KEY": KEY}, timeout_s=0.5,
                              retry=RetryPolicy(attempts=1))
    pollers = CarbonPollers.from_regions(regions, redis_store, options=options, lock=LockTiming(ttl_s=2.0))
    await pollers.start()
    try:
        await wait_for(lambda: pollers.counters.value(metrics.WRITES, kind="carbon_intensity") >= 2, timeout_s=10)
        server.stop()  # the provider goes down
        polls_when_down = pollers.counters.value(metrics.POLLS)
        await wait_for(lambda: pollers.counters.value(metrics.FAILURES, reason="connect") >= 4, timeout_s=10)
        assert pollers.counters.value(metrics.POLLS) > polls_when_down
        # The store still holds the last good values, with their own observed_at.
        stored = await read_signal(redis_store, "DE-LU")
        assert stored is not None and (stored.value, stored.observed_at) == (450.0, observed)
        carbon = await read_carbon(redis_store, regions)
    finally:
        await pollers.stop()

    builder = SnapshotBuilder(compile_fleet(tuple(regions)), compile_policy(policy))
    max_age = policy.max_age.carbon

    # Within the limit: carbon ranks, and the cleaner grid (NO) wins on it.
    fresh = decide(builder, carbon, now=observed + max_age - 60)
    assert fresh.energy_ranking and "carbon-scorer" in fresh.scorer_names and fresh.fallbacks == ()
    by_region = {s.candidate.region.name: s for s in fresh.ranked}
    assert by_region["eu-north"].quantities["carbon-scorer"] < by_region["eu-central"].quantities["carbon-scorer"]

    # Past the limit: the carbon scorer abstains, with the signal's true age, and the
    # ranking is the policy's fallback order.
    now = observed + max_age + 900
    stale = decide(builder, carbon, now=now)
    (fallback,) = stale.fallbacks
    assert (fallback.signal, fallback.scorer) == ("carbon", "carbon-scorer")
    assert fallback.age_s == now - observed == max_age + 900
    assert fallback.max_age_s == max_age
    assert not stale.energy_ranking and "carbon-scorer" not in stale.scorer_names
    assert set(stale.scorer_names) <= {term.type for term in policy.fallback.scorers}
    assert all("carbon-scorer" not in s.quantities for s in stale.ranked)

    # The old values no longer move the ranking: swapping them changes nothing once stale...
    swapped = {"DE-LU": replace(carbon["DE-LU"], value=carbon["NO"].value),
               "NO": replace(carbon["NO"], value=carbon["DE-LU"].value)}
    stale_swapped = decide(builder, swapped, now=now)
    assert [(s.candidate.key, s.total) for s in stale_swapped.ranked] == [(s.candidate.key, s.total)
                                                                        for s in stale.ranked]
    # ...while the same swap moves the carbon scores when the values are fresh.
    fresh_swapped = decide(builder, swapped, now=observed + max_age - 60)
    swapped_by_region = {s.candidate.region.name: s for s in fresh_swapped.ranked}
    assert (swapped_by_region["eu-north"].quantities["carbon-scorer"]
            > swapped_by_region["eu-central"].quantities["carbon-scorer"])
