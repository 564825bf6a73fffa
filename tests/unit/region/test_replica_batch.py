"""The router's prediction and the region's bill of the same request agree on pools of two
and four replicas, at concurrency 1 and 64 (issue 25).

The router predicts a request's energy at the per-replica batch of what the pool publishes
(``SnapshotBuilder.perf_of``: running / replicas + 1); the region bills it at the running
batch of the replica that ran it, averaged over the request's lifetime there (``InFlight``
from the replica's reports, then ``energy_object``). The trace is the replicas' own: two
engines stepping, each keeping its running count and ``RunningIntegral`` as
``RegionLLMServer`` does and reporting them at each stream's start and end, the pool's
router sending each request to the least loaded one, Llama 3.1 8B requests of 512 prompt and
256 output tokens in a closed loop. The bill the gateway used to make (the pool's in-flight
count, every replica and the queue, as the batch) is printed, and shown to fall outside the
interval where it is off by more than the interval (queued requests, four replicas).
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.step import EnergyCoefficients
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.energy_report import PoolEnergyProfile, energy_object
from scheduler.region.inflight import InFlight, RequestShare
from scheduler.region.replica_report import ReplicaReport, RunningIntegral
from scheduler.region.stream_assembler import Usage
from scheduler.types import PoolLiveState

POOL, MODEL = "h100-chat", "llama-3.1-8b"
PROMPT, OUTPUT = 512, 256
STEP_S = 0.03


def pool_config(replicas: int) -> PoolConfig:
    # One 8B replica per GPU: the router divides the pool's figures by the GPU count.
    return PoolConfig(name=POOL, gpu="H100-80GB", count=replicas, power_cap_w=700,
                      models=(ModelDeployment(name=MODEL, max_context=8192),))


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Engine:
    """One replica's engine: admits waiting requests up to ``max_num_seqs``, gives every
    running sequence one token per step (the prefill step gives the first)."""

    name: str
    clock: Clock
    max_num_seqs: int
    integral: RunningIntegral = field(init=False)
    running: dict[str, int] = field(default_factory=dict)
    waiting: collections.deque[str] = field(default_factory=collections.deque)

    def __post_init__(self) -> None:
        self.integral = RunningIntegral(clock=self.clock)

    def report(self) -> ReplicaReport:
        at, running_s = self.integral.read()
        return ReplicaReport(self.name, "", (), self.integral.running, running_s, at)

    def step(self) -> tuple[list[tuple[str, int]], list[str]]:
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running[self.waiting.popleft()] = 0
        for request_id in self.running:
            self.running[request_id] += 1
        progressed = list(self.running.items())
        finished = [request_id for request_id, tokens in progressed if tokens >= OUTPUT]
        for request_id in finished:
            del self.running[request_id]
        self.integral.update(len(self.running))  # vLLM's stats: after finished requests leave
        return progressed, finished

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)


@dataclass(frozen=True)
class Billed:
    predicted: EnergyCoefficients
    share: RequestShare
    receipt: dict[str, object]


def closed_loop(concurrency: int, replicas: int, max_num_seqs: int, lifetimes: int = 6) -> list[Billed]:
    """Every request billed after the first one and a half lifetimes (the steady state)."""
    fleet = load_checked_fleet()
    pool = pool_config(replicas)
    region = next(r for r in fleet.regions if r.name == "eu-north").model_copy(update={"pools": (pool,)})
    builder = SnapshotBuilder(compile_fleet((region,)), compile_policy(fleet.policy("default")))
    candidate = next(c for c in builder.candidates if c.model.name == MODEL)
    kv_capacity = builder.rated[candidate.index].costs.kv_capacity_tokens
    profile = PoolEnergyProfile.of(pool)
    clock = Clock()
    flight = InFlight(clock=clock)
    engines = [Engine(f"LLMServer:{POOL}#r{k}", clock, max_num_seqs) for k in range(replicas)]
    rng = random.Random(concurrency)
    starts = sorted(rng.uniform(0, OUTPUT * STEP_S) for _ in range(concurrency))
    predicted: dict[str, EnergyCoefficients] = {}
    submitted_at: dict[str, float] = {}
    billed: list[Billed] = []

    def published() -> PoolLiveState:
        """The pool's state as the gateway publishes it."""
        running = flight.running(POOL) or 0
        usage = sum(sum(PROMPT + n for n in e.running.values()) / kv_capacity for e in engines)
        return PoolLiveState(queue_depth=flight.count(POOL) - running, running=running,
                             kv_cache_usage=usage / replicas, replicas=replicas)

    def submit() -> None:
        request_id = f"q{len(submitted_at)}"
        # The router decides first, on what the pool published.
        predicted[request_id] = builder.perf_of(candidate, published()).energy
        submitted_at[request_id] = clock.t
        flight.start(POOL, request_id, MODEL)
        engine = min(engines, key=lambda e: e.load)
        engine.waiting.append(request_id)
        flight.report(request_id, engine.report())

    for step in range(lifetimes * OUTPUT):
        clock.t = step * STEP_S
        while starts and starts[0] <= clock.t:
            starts.pop(0)
            submit()
        for engine in engines:
            progressed, finished = engine.step()
            for request_id, tokens in progressed:
                flight.progress(request_id, PROMPT, tokens)
            for request_id in finished:
                flight.report(request_id, engine.report())
                share = flight.finish(request_id)
                receipt = energy_object(profile, MODEL, Usage(PROMPT, OUTPUT, 0), share)
                if submitted_at[request_id] > 1.5 * OUTPUT * STEP_S:
                    billed.append(Billed(predicted[request_id], share, receipt))
                submit()  # closed loop: the client sends its next request
    return billed


@pytest.mark.parametrize(("concurrency", "replicas", "max_num_seqs", "old_bill_outside"), [
    (1, 2, 256, False), (64, 2, 256, False), (64, 2, 16, True), (64, 4, 256, True),
], ids=["c1", "c64", "c64-queued", "c64-4-replicas"])
def test_the_router_s_prediction_and_the_region_s_receipt_agree(
        concurrency: int, replicas: int, max_num_seqs: int, old_bill_outside: bool) -> None:
    billed = closed_loop(concurrency, replicas, max_num_seqs)
    assert len(billed) >= max(3, concurrency)
    profile = PoolEnergyProfile.of(pool_config(replicas))
    ratios, batches, router_j, receipt_j, pool_wide_j = [], [], [], [], []
    for b in billed:
        expected = b.predicted.joules(PROMPT, 0, OUTPUT)
        got = b.receipt["energy_j"]
        assert isinstance(got, float)
        ratios.append(got / expected - 1.0)
        batches.append(b.share.mean_batch)
        router_j.append(expected)
        receipt_j.append(got)
        # What the gateway billed before: the pool's in-flight requests (every replica and
        # the queue) as the batch.
        old = RequestShare(duration_s=b.share.duration_s, mean_batch=float(concurrency), replica=None, measured=None)
        pool_wide_j.append(energy_object(profile, MODEL, Usage(PROMPT, OUTPUT, 0), old)["energy_j"])
    interval = billed[0].predicted.rel_error
    print(f"\nc={concurrency} on {replicas} replicas of max_num_seqs {max_num_seqs}: {len(billed)} receipts, "
          f"replica batch {min(batches):.1f}-{max(batches):.1f}; router {min(router_j):.1f}-{max(router_j):.1f} J, "
          f"receipt {min(receipt_j):.1f}-{max(receipt_j):.1f} J, receipt/router - 1 in "
          f"[{min(ratios):+.1%}, {max(ratios):+.1%}] (interval +-{interval:.0%}); the pool-wide batch "
          f"{concurrency} billed {pool_wide_j[0]:.1f} J ({pool_wide_j[0] / router_j[0] - 1:+.0%})")
    assert all(abs(r) <= interval for r in ratios)
    assert all(b <= min(max_num_seqs, concurrency) + 1e-9 for b in batches)  # never the queue
    if old_bill_outside:
        assert all(abs(old / router - 1.0) > interval for old, router in zip(pool_wide_j, router_j, strict=True))
