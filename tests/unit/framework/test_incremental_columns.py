"""Columns kept or updated from the last snapshot's equal those computed afresh.

Each test walks a random sequence of snapshots of one builder (each with its delta from the
last, as in the router and the simulator: a few pools, signals or clocks change at each step)
through the framework's state (``PlanState``: it keeps a plugin's columns while the delta
touches none of the inputs the plugin reads) and compares what it gives on each with what the
plugins give on the same inputs built by a new builder, computed from scratch (``prepared``)."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import PolicyConfig, RegionConfig, TelemetryGate
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.columns import by_model, frame
from scheduler.framework.plugin import Prepares
from scheduler.framework.scheduler import Scheduler
from scheduler.framework.state import PlanState, prepared
from scheduler.plugins import default_scheduler_registry
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.filters.pool_served import PoolServedFilter
from scheduler.plugins.scorers.affinity import AffinityScorer
from scheduler.plugins.scorers.carbon import CarbonScorer
from scheduler.signal_check import CLOCK_SKEW_S
from scheduler.types import Candidate, FleetSnapshot, GeoPoint, PoolLiveState, RegionLiveState, Request, Signal
from tests.literals import NOW, pool, region

MODELS = ("llama-3.1-8b", "llama-3.1-70b", "llama-3.2-3b")


def fleet(count: int = 8) -> tuple[RegionConfig, ...]:
    """Regions of two pools, some serving several models (so a model's candidates are not the fleet)."""
    eight = {"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072}
    big = {"name": "llama-3.1-70b", "precision": "bf16", "max_context": 65536, "tensor_parallel": 4}
    small = {"name": "llama-3.2-3b", "precision": "bf16", "max_context": 65536}
    return tuple(
        region(f"r{i}", zone=f"Z{i}", lat=10.0 * i, pools=[
            pool("h100", "H100-80GB", count=16, models=[eight, big] if i % 2 else [eight]),
            pool("a100", "A100-80GB", count=8, models=[eight, small] if i % 3 else [small]),
        ]) for i in range(count))


def random_pool_state(rng: random.Random) -> PoolLiveState:
    return PoolLiveState(queue_depth=rng.choice((0, 0, 2, 9)), running=rng.choice((0, 1, 7, 40)),
                         kv_cache_usage=rng.choice((0.0, 0.3, 0.97)), arrival_rate=rng.choice((0.0, 0.031, 2.5)),
                         prompt_tokens_rate=rng.choice((0.0, 30.0, 2500.0)))


def columns_equal(a: Any, b: Any) -> bool:
    """Equal columns: arrays of one shape and values, in mappings and tuples alike."""
    if dataclasses.is_dataclass(a) and not isinstance(a, type) and type(a) is type(b):
        return all(columns_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, Mapping):
        return isinstance(b, Mapping) and a.keys() == b.keys() and all(columns_equal(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return isinstance(b, tuple) and len(a) == len(b) and all(map(columns_equal, a, b))
    return bool(a == b)


def fresh(regions: tuple[RegionConfig, ...], policy: PolicyConfig, snapshot: FleetSnapshot) -> FleetSnapshot:
    """The same inputs built by a new builder (no previous build: a delta of every input)."""
    return SnapshotBuilder(compile_fleet(regions),
                           compile_policy(policy)).build(snapshot.now, carbon=snapshot.carbon, live=snapshot.live)


def kept_columns(state: PlanState, snapshot: FleetSnapshot, index: Any, plugin: Prepares) -> Any:
    """``plugin``'s columns for the candidates at ``index`` as ``state`` keeps them across snapshots."""
    state.advance(snapshot)
    model = snapshot.candidates[int(index[0])].deployment.name
    return state.restricted(model, index)[state.plugins.index(plugin)]


def test_a_frame_updated_from_the_last_one_equals_a_rebuilt_one_on_a_multi_model_fleet(default_policy) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(3)
    regions = fleet()
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    plan = PlanState(ModelIndex(), ())
    states = {r.name: RegionLiveState(r.name, True, NOW, {p.name: PoolLiveState() for p in r.pools}) for r in regions}
    for step in range(60):
        # one to three pools change (sometimes only pools of models other than the one asked)
        for _ in range(rng.choice((1, 1, 2, 3)) if step % 11 else len(regions)):
            r = rng.choice(regions)
            pools = dict(states[r.name].pools)
            pools[rng.choice(r.pools).name] = random_pool_state(rng)
            states = {**states, r.name: RegionLiveState(r.name, True, NOW, pools)}
        snapshot = builder.build(NOW, live=states)
        rebuilt = fresh(regions, default_policy, snapshot)
        plan.advance(snapshot)
        for model in rng.sample(MODELS, 2):
            index = by_model(snapshot.candidates)[model]
            got, expected = plan.frame(snapshot, model, index), frame(rebuilt, model, by_model(rebuilt.candidates)[model])
            assert np.array_equal(got.index, expected.index)
            for name in ("prediction", "queue_wait_s", "live", "key_hash", "lat_rad"):
                assert np.array_equal(getattr(got, name), getattr(expected, name)), (step, model, name)


@pytest.mark.parametrize("gated", [False, True], ids=["default", "telemetry-gated"])
def test_every_plugins_columns_kept_by_the_framework_equal_columns_computed_afresh(default_policy, gated) -> None:  # type: ignore[no-untyped-def]
    """Pools change, go cold or stale, start or stop metering, regions drop out and come back,
    signals move: every registered plugin's columns as the framework keeps them (by the inputs
    it declares it reads) equal its columns computed from scratch on the same inputs."""
    rng = random.Random(5)
    regions = fleet()
    policy = default_policy.model_copy(update={"telemetry_gate": TelemetryGate(modelled_only="canary-only")}
                                       ) if gated else default_policy
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy))
    registry = default_scheduler_registry()
    plugins: tuple[Prepares, ...] = tuple(make() for kind in (registry.sources, registry.filters, registry.matchers,
                                                              registry.scorers) for make in kind.values())
    plan = PlanState(ModelIndex(), plugins)
    states: dict[str, RegionLiveState] = {}
    signals: dict[str, Signal] = {}
    now = NOW
    for step in range(80):
        now += rng.choice((0.0, 1.0, 30.0, 900.0))
        r = rng.choice(regions)
        if step % 13 == 0:
            states = {}  # every pool back to nominal: most rows change
        elif rng.random() < 0.2:
            signals[r.grid_zone] = Signal("carbon_intensity", r.grid_zone, rng.uniform(20, 800), "gCO2eq/kWh", now,
                                          now, "test")
        else:  # some pools cold (no warm replica), or with one starting
            states = {**states, r.name: RegionLiveState(r.name, rng.random() < 0.9, now, {
                p.name: dataclasses.replace(random_pool_state(rng), replicas=rng.choice((None, 0, 2)),
                                            starting_replicas=rng.choice((0, 1)),
                                            gpu_power_w=rng.choice((None, 400.0))) for p in r.pools})}
        snapshot = builder.build(now, carbon=dict(signals), live=states)
        rebuilt = fresh(regions, policy, snapshot)
        plan.advance(snapshot)
        for model in MODELS:
            index = by_model(snapshot.candidates)[model]
            for plugin, got in zip(plugins, plan.restricted(model, index), strict=True):
                assert columns_equal(got, prepared(plugin, rebuilt, index)), (step, model, plugin.TYPE)


def test_carbon_columns_kept_across_snapshots_equal_fresh_ones_at_every_clock(default_policy) -> None:  # type: ignore[no-untyped-def]
    """Signals come and go, turn invalid, and the clock walks across the max age and the
    clock-skew tolerance of the oldest and newest of them."""
    rng = random.Random(11)
    regions = fleet(5)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    max_age = default_policy.max_age.carbon
    scorer = CarbonScorer()
    plan = PlanState(ModelIndex(), (scorer,))
    signals = {r.grid_zone: Signal("carbon_intensity", r.grid_zone, 100.0 + i, "gCO2eq/kWh", NOW - 600 * i,
                                   NOW - 600 * i, "test") for i, r in enumerate(regions)}
    now = NOW
    for step in range(300):
        event = rng.random()
        zone = rng.choice(regions).grid_zone
        if event < 0.03:
            signals.pop(zone, None)
        elif event < 0.06:
            signals[zone] = Signal("carbon_intensity", zone, math.nan, "gCO2eq/kWh", now, now, "test")
        elif event < 0.3 or zone not in signals or not math.isfinite(signals[zone].value):
            observed = now + rng.choice((-max_age - 1.0, -max_age, -10.0, 0.0, CLOCK_SKEW_S, CLOCK_SKEW_S + 1.0))
            signals[zone] = Signal("carbon_intensity", zone, rng.uniform(20, 800), "gCO2eq/kWh", observed, observed,
                                   "test")
        # the clock moves on, sometimes exactly to a limit of the oldest or newest signal
        observed_at = [s.observed_at for s in signals.values() if math.isfinite(s.observed_at)]
        limits = [max_age + min(observed_at, default=now), max(observed_at, default=now) - CLOCK_SKEW_S]
        limit = rng.choice(limits)
        now = rng.choice((now + rng.uniform(0, 900), limit, math.nextafter(limit, math.inf),
                          math.nextafter(limit, -math.inf)))
        snapshot = builder.build(now, carbon=dict(signals))
        base = by_model(snapshot.candidates)["llama-3.1-8b"]
        rebuilt = fresh(regions, default_policy, snapshot)
        got = kept_columns(plan, snapshot, base, scorer)
        expected = prepared(scorer, rebuilt, base)
        assert columns_equal(got, expected), step


def test_pool_served_columns_kept_across_snapshots_equal_fresh_ones(default_policy) -> None:  # type: ignore[no-untyped-def]
    """Regions publish pools with and without model lists, drop pools, go stale."""
    rng = random.Random(13)
    regions = fleet(6)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    plugin = PoolServedFilter()
    plan = PlanState(ModelIndex(), (plugin,))
    states: dict[str, RegionLiveState] = {}
    now = NOW
    for step in range(120):
        now += rng.choice((0.0, 1.0, 3.0))
        r = rng.choice(regions)
        event = rng.random()
        pools: dict[str, PoolLiveState] = {}
        for p in r.pools:
            if rng.random() < 0.15:
                continue  # the pool is not up
            models = None if rng.random() < 0.6 else {m["name"]: rng.choice((4096, 131072))
                                                       for m in (d.model_dump() for d in p.models)}
            pools[p.name] = dataclasses.replace(random_pool_state(rng), models=models)
        if event < 0.1:
            states.pop(r.name, None)
        elif event < 0.2:
            states[r.name] = RegionLiveState(r.name, True, now - 60.0, pools)  # stale
        else:
            # republished unchanged (the same mapping) or with new pool states
            kept = states.get(r.name)
            states[r.name] = RegionLiveState(r.name, True, now, kept.pools if kept and event < 0.5 else pools)
        # the other regions republish their last pools at ``now``
        states = {name: state if state.observed_at < now - 30 else RegionLiveState(name, True, now, state.pools)
                  for name, state in states.items()}
        snapshot = builder.build(now, live=states)
        for model in MODELS:
            index = by_model(snapshot.candidates)[model]
            got = kept_columns(plan, snapshot, index, plugin)
            expected = [served_rule(snapshot, snapshot.candidates[i]) for i in index.tolist()]
            assert got.served.tolist() == [served for served, _ in expected], (step, model)
            assert got.live_context.tolist() == [context for _, context in expected], (step, model)
            assert [got.verdicts[i] is None for i in index.tolist()] == [served for served, _ in expected]


def served_rule(snapshot: FleetSnapshot, c: Candidate) -> tuple[bool, float]:
    """The pool-served filter's rule (its docstring) for one candidate: served, and its live
    context limit (inf: none)."""
    state = snapshot.live.get(c.region.name)
    if state is None or snapshot.now - state.observed_at > snapshot.policy.max_age.region_state or not state.pools:
        return True, math.inf
    pool_state = state.pools.get(c.pool.name)
    if pool_state is None:
        return False, math.inf
    if pool_state.models is None:
        return True, math.inf
    context = pool_state.models.get(c.deployment.name)
    return (False, math.inf) if context is None else (True, float(context))


def test_decisions_on_a_chain_of_snapshots_equal_decisions_on_fresh_ones(default_policy) -> None:  # type: ignore[no-untyped-def]
    """The whole decision, by a scheduler whose columns carry over from snapshot to snapshot,
    is the decision on the same inputs with nothing carried over."""
    rng = random.Random(17)
    regions = fleet()
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    registry = default_scheduler_registry()
    chained, afresh = (Scheduler.from_registry(registry, rng=random.Random(1)) for _ in range(2))
    signals = {r.grid_zone: Signal("carbon_intensity", r.grid_zone, rng.uniform(20, 800), "gCO2eq/kWh", NOW, NOW,
                                   "test") for r in regions}
    states = {r.name: RegionLiveState(r.name, True, NOW, {p.name: PoolLiveState() for p in r.pools}) for r in regions}
    now = NOW
    for step in range(150):
        now += rng.uniform(0, 40)
        r = rng.choice(regions)
        pools = dict(states[r.name].pools)
        pools[rng.choice(r.pools).name] = random_pool_state(rng)
        states = {name: RegionLiveState(name, True, now, pools if name == r.name else state.pools)
                  for name, state in states.items()}
        if step % 20 == 0:
            zone = rng.choice(regions).grid_zone
            signals[zone] = Signal("carbon_intensity", zone, rng.uniform(20, 800), "gCO2eq/kWh", now, now, "test")
        snapshot = builder.build(now, carbon=signals, live=states)
        rebuilt = fresh(regions, default_policy, snapshot)
        request = Request(request_id=f"r{step}", model=rng.choice(MODELS), prompt_tokens=rng.randint(10, 40000),
                          max_tokens=rng.randint(1, 2000), client_location=GeoPoint(rng.uniform(-60, 60), 0.0),
                          workload_class=rng.choice(("interactive", "batch")))
        got, expected = chained.schedule(request, snapshot), afresh.schedule(request, rebuilt)
        assert [c.key for c in got.ranked_candidates] == [c.key for c in expected.ranked_candidates], step
        assert np.array_equal(np.asarray(got.totals), np.asarray(expected.totals)), step
        assert [r.reason for r in got.rejected] == [r.reason for r in expected.rejected], step


def test_the_affinity_scorer_prices_a_home_with_the_snapshot_prefill_coefficients(default_policy) -> None:  # type: ignore[no-untyped-def]
    """Its prefill coefficients come from the perf tuple of the snapshot it scores on, also
    after other snapshots of the same builder."""
    from scheduler.framework.predict import request_view
    from scheduler.types import WarmPrefix

    rng = random.Random(19)
    regions = fleet(4)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    scorer = AffinityScorer()
    request = Request(request_id="w", model="llama-3.1-8b", prompt_tokens=3000, max_tokens=50, workflow_id="wf-1")
    for _ in range(20):
        r = rng.choice(regions)
        live = {r.name: RegionLiveState(r.name, True, NOW, {p.name: random_pool_state(rng) for p in r.pools})}
        snapshot = builder.build(NOW, live=live).with_workflows(
            {"wf-1": WarmPrefix(regions[0].name, "h100", 2000, NOW, source="workflow")})
        base = by_model(snapshot.candidates)["llama-3.1-8b"]
        lost = scorer.score(request_view(request, snapshot, base), prepared(scorer, snapshot, base),
                            slice(None))
        assert isinstance(lost, np.ndarray)
        for position, index in enumerate(base.tolist()):
            c = snapshot.candidates[index]
            e = snapshot.perf[index].energy
            home = c.region.name == regions[0].name and c.pool.name == "h100"
            pairs = 3000.0 * (3000.0 - 3000.0 / 2) - 1000.0 * (3000.0 - 1000.0 / 2)
            expected = 0.0 if home else e.prefill_j_per_token * 2000.0 + e.prefill_j_per_pair * pairs
            assert lost[position] == expected
