"""A candidate's cost depends on that candidate alone, to the last bit: identical candidates
cost exactly the same wherever they stand in the list, so exact ties go to the tie-break key
and not to their positions."""

from __future__ import annotations

import random

from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.types import GeoPoint, Request
from tests.literals import carbon, region


def test_identical_candidates_cost_exactly_the_same_wherever_they_stand(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    # Many identical regions among different ones, four scorers: every identical one must get
    # the very same cost. (A vector-matrix product across the survivors gave about one decision
    # in four here an ulp of difference between twins, by their positions.)
    rng = random.Random(3)
    twins = [region(f"t{i}", zone="T", lat=50.0, lon=9.0) for i in range(40)]
    others = [region(f"o{i}", zone=f"O{i}", lat=rng.uniform(-40, 60), lon=rng.uniform(-120, 140),
                     pue=rng.uniform(1.05, 1.6), price=rng.uniform(0.02, 0.3)) for i in range(30)]
    fleet = [r for pair in zip(twins, others, strict=False) for r in pair] + twins[len(others):]
    signals = [carbon("T", 222.0)] + [carbon(f"O{i}", rng.uniform(20, 700)) for i in range(len(others))]
    snapshot = make_snapshot(fleet, carbon_signals=signals)
    scheduler = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(5))
    for i in range(60):
        request = Request(f"r{i}", "llama-3.1-8b", prompt_tokens=rng.randint(1, 20000),
                          max_tokens=rng.randint(1, 2000),
                          client_location=GeoPoint(rng.uniform(-50, 60), rng.uniform(-170, 170)))
        decision = scheduler.schedule(request, snapshot)
        costs = {decision.fleet[s].region.name: float(t)
                 for s, t in zip(decision.survivor_index, decision.totals, strict=True)}
        twin_costs = {cost for name, cost in costs.items() if name.startswith("t")}
        assert len(twin_costs) == 1, (i, sorted(twin_costs))
