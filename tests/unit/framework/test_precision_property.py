"""Property: whatever the fleet's precisions, the policy (its objective, its precision floors),
the signals (fresh, stale, missing: the fallback order), the kill switch and the request, a
sensitive task class is never served below bf16, a request that names no precision never below
its class's floor, and one that names a precision only at it. ``ranked_candidates`` is the
failover order the dispatcher walks, so this holds for every failover too."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.config.loader import load_fleet
from scheduler.energy.model_catalogue import PRECISION_RANK
from scheduler.framework.scheduler import Scheduler
from scheduler.plugins import default_scheduler_registry
from scheduler.types import PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region

PRECISIONS = ("bf16", "fp16", "fp8", "int8", "int4")
GPUS = ("A100-80GB", "H100-80GB", "H200-141GB")
CLASSES = ("interactive", "batch", "deferrable")
TASKS = (None, "medical", "legal", "chat", "code")
SHIPPED = dict(load_fleet().policies)


@st.composite
def fleets(draw: st.DrawFn) -> list:  # type: ignore[type-arg]
    regions = []
    for i in range(draw(st.integers(1, 5))):
        pools = []
        for j, gpu in enumerate(draw(st.lists(st.sampled_from(GPUS), min_size=1, max_size=3, unique=True))):
            precision = draw(st.sampled_from(PRECISIONS))
            pools.append(pool(f"p{j}", gpu, models=[{"name": "llama-3.1-8b", "precision": precision,
                                                      "max_context": 131072}]))
        regions.append(region(f"r{i}", "EU", zone=f"Z{i}", lat=50.0, lon=float(i), pools=pools))
    return regions


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    regions=fleets(),
    policy_name=st.sampled_from(sorted(SHIPPED)),
    floors=st.dictionaries(st.sampled_from(CLASSES), st.sampled_from(PRECISIONS), max_size=3),
    sensitive=st.sets(st.sampled_from(("medical", "legal")), max_size=2),
    workload_class=st.sampled_from(CLASSES),
    task=st.sampled_from(TASKS),
    asked=st.one_of(st.none(), st.sampled_from(PRECISIONS)),
    carbon_ages=st.lists(st.one_of(st.none(), st.floats(0, 20_000)), min_size=5, max_size=5),
    live_ages=st.lists(st.one_of(st.none(), st.floats(0, 30)), min_size=5, max_size=5),
    energy_on=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_no_decision_serves_below_the_precision_a_request_may_have(  # type: ignore[no-untyped-def]
    make_snapshot, regions, policy_name, floors, sensitive, workload_class, task, asked, carbon_ages, live_ages,
    energy_on, seed,
) -> None:
    policy = SHIPPED[policy_name].model_copy(update={"precision_floor": floors,
                                                     "sensitive_task_classes": tuple(sorted(sensitive))})
    signals = [carbon(f"Z{i}", 100.0 + 50 * i, age) for i, age in enumerate(carbon_ages[: len(regions)])
               if age is not None]
    live = [RegionLiveState(region=r.name, healthy=True, observed_at=NOW - age,
                            pools={p.name: PoolLiveState(queue_depth=i, kv_cache_usage=0.1) for p in r.pools})
            for i, (r, age) in enumerate(zip(regions, live_ages, strict=False)) if age is not None]
    snapshot = make_snapshot(regions, policy=policy, carbon_signals=signals, live=live,
                             energy_routing_enabled=energy_on)
    request = Request(request_id="p", model="llama-3.1-8b", prompt_tokens=512, max_tokens=64,
                      workload_class=workload_class, task_class=task, precision=asked)
    decision = Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(seed)).schedule(request, snapshot)

    floor = PRECISION_RANK[floors.get(workload_class, "bf16")]
    for candidate in decision.ranked_candidates:
        served = candidate.deployment.precision
        if task in sensitive:
            assert PRECISION_RANK[served] >= PRECISION_RANK["bf16"], (task, served)
        if asked is None:
            assert PRECISION_RANK[served] >= floor, (workload_class, floors, served)
        else:
            assert served == asked
    # Nothing that the rules allow is lost: a candidate at an allowed precision is ranked or
    # rejected for another reason, never by the model filter.
    for rejection in decision.rejected:
        if rejection.plugin != "model-filter":
            continue
        served = rejection.candidate.deployment.precision
        allowed = (asked is None and PRECISION_RANK[served] >= floor) or served == asked
        assert not allowed or (task in sensitive and PRECISION_RANK[served] < PRECISION_RANK["bf16"]), rejection
