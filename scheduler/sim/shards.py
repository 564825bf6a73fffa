"""One run cut into time shards that simulate in parallel (``scheduler bench simulate --jobs N``).

A shard is a contiguous range of the workload's rows, simulated on a fleet of its own that
starts idle; the shards' outcomes are concatenated in row order and summarised once, so every
figure (percentiles included) is of the whole run. Each shard starts at the widest gap between
two arrivals within ``SEARCH_SHARE`` of the rows around its ideal boundary (``starts``): at a
year's rates (1,000,000 requests: one every 31 s on average) the widest of 10,000 gaps is
several minutes, far longer than any request's life, so the fleet a shard inherits would have
been idle anyway.

What a shard does not inherit, and so differs from one long run: the replicas' prefix caches
(cold at a shard's start), the snapshot's rate averages (``arrival_rate``), and the tie-break
RNG's stream (each shard's scheduler is seeded alike). The pools' true costs are the same in
every shard (seeded per pool). Trade-off, stated: with N shards the N - 1 boundaries see a cold
cache; at a year's scale that is noise (``docs/simulation.md``, "Speed"). Workloads with
deferrable requests or workflows are not cut: a held request or a workflow's later steps would
cross a boundary.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence

import numpy as np

from scheduler.sim.report import FallbackAges, PoolEnergy, RunOutcome

# How far from its ideal row a shard boundary may move to find a wide gap (share of all rows).
SEARCH_SHARE = 0.01
_PER_REQUEST = ("ran_in", "ttft_s", "queue_wait_s", "latency_s", "budget_s", "energy_j", "grams", "output_tokens",
                "prompt_tokens", "ran_pool", "predicted_j", "predicted_ttft_s")


def starts(arrival_s: Sequence[float], shards: int, search_share: float = SEARCH_SHARE) -> list[int]:
    """The first row of each shard: 0, then for each ideal boundary k x n / shards the row after
    the widest arrival gap within ``search_share`` x n rows of it."""
    n = len(arrival_s)
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    shards = min(shards, max(1, n))
    arrival = np.asarray(arrival_s, dtype=np.float64)
    gaps = np.diff(arrival)  # gaps[i]: between rows i and i + 1
    reach = max(1, int(search_share * n))
    out = [0]
    for k in range(1, shards):
        ideal = k * n // shards
        low, high = max(out[-1] + 1, ideal - reach), min(n - 1, ideal + reach)
        if low > high:
            continue
        out.append(int(low + np.argmax(gaps[low - 1:high])))
    return out


def merge(outcomes: Sequence[RunOutcome]) -> RunOutcome:
    """The shards' outcomes (in row order) as one run's. Hourly counts must share hour 0
    (``Simulation(hour_origin=...)``); timings: ``total`` is the longest shard's, the others
    are summed (CPU seconds)."""
    first = outcomes[0]
    if len(outcomes) == 1:
        return first
    per_request = {name: np.concatenate([getattr(o, name) for o in outcomes]) for name in _PER_REQUEST}
    hours = max(len(o.hourly) for o in outcomes)
    hourly = np.zeros((hours, len(first.regions)), dtype=np.int64)
    counters: Counter[str] = Counter()
    unschedulable_by: Counter[str] = Counter()
    ages = FallbackAges()
    busy: dict[str, float] = {}
    replica: dict[str, float] = {}
    timings: dict[str, float] = {}
    for o in outcomes:
        hourly[:len(o.hourly)] += o.hourly
        counters.update(o.counters)
        unschedulable_by.update(o.unschedulable_by)
        ages.merge(o.fallback_ages)
        for place, value in o.busy_s.items():
            busy[place] = busy.get(place, 0.0) + value
            replica[place] = replica.get(place, 0.0) + o.replica_s[place]
        for name, seconds in o.timings_s.items():
            timings[name] = max(timings.get(name, 0.0), seconds) if name == "total" else timings.get(name, 0.0) + seconds
    return RunOutcome(
        policy=first.policy, regions=first.regions, pool_gpus=first.pool_gpus, **per_request, hourly=hourly,
        start=first.start,
        counters=counters, fallback_ages=ages, unschedulable_by=unschedulable_by, busy_s=busy, replica_s=replica,
        idle_j=sum(o.idle_j for o in outcomes), timings_s=timings,
        pool_energy=[functools.reduce(PoolEnergy.plus, pools) for pools in zip(*(o.pool_energy for o in outcomes),
                                                                                  strict=True)],
        autoscaled=first.autoscaled,
    )
