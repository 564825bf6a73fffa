"""The snapshot builder reuses what did not change: a region whose fresh pool states equal the
last build's keeps its candidates' predictions, and the result is always what a builder
that never saw an earlier build makes."""

from __future__ import annotations

import dataclasses
import random

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.framework.columns import fresh_pools
from scheduler.types import FleetSnapshot, PoolLiveState, RegionLiveState, judge_fresh
from tests.literals import NOW, carbon, pool, region


def _regions(n: int) -> tuple[RegionConfig, ...]:
    """``n`` regions of two pools each (an H100 pool and four L4s): the fleets the randomized
    builds below run on."""
    return tuple(region(f"r{i}", pools=[pool("h100", "H100-80GB"), pool("l4", "L4", count=4)]) for i in range(n))


def test_a_snapshot_has_every_field_the_constructor_sets(default_policy) -> None:  # type: ignore[no-untyped-def]
    snapshot = SnapshotBuilder(compile_fleet((region("a", zone="A"),)),
                               compile_policy(default_policy)).build(NOW, carbon={"A": carbon("A", 90)})
    fields = {f.name: getattr(snapshot, f.name) for f in dataclasses.fields(FleetSnapshot)}
    assert set(vars(snapshot)) >= set(fields)
    rebuilt = FleetSnapshot(**fields)
    assert all(getattr(rebuilt, name) is value for name, value in fields.items())
    assert snapshot.live_key is not SnapshotBuilder(compile_fleet((region("a"),)),
                                                    compile_policy(default_policy)).build(NOW).live_key


def test_incremental_builds_equal_builds_from_scratch(default_policy) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(2)
    regions = _regions(6)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    live: dict[str, RegionLiveState] = {}
    now = NOW
    for _ in range(60):
        now += rng.choice((0.5, 1.0, 7.0))
        for r in regions:
            roll = rng.random()
            if roll < 0.1:
                live.pop(r.name, None)  # never seen / expired
            elif roll < 0.4 or r.name not in live:
                live[r.name] = RegionLiveState(r.name, True, now, {p.name: PoolLiveState(
                    running=rng.choice((0, 3, 30)), queue_depth=rng.choice((0, 2)),
                    kv_cache_usage=rng.choice((0.0, 0.5)), arrival_rate=rng.choice((0.0, 1.5))) for p in r.pools})
            elif roll < 0.7:
                # republished unchanged: same pool mapping, or an equal copy of it
                state = live[r.name]
                pools = state.pools if rng.random() < 0.5 else dict(state.pools)
                live[r.name] = RegionLiveState(r.name, True, now, pools)
            # else: not republished (it ages, and goes stale after max_age.region_state)
        snapshot = builder.build(now, live=dict(live))
        fresh = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy)).build(now, live=dict(live))
        assert snapshot.perf == fresh.perf


def test_the_delta_names_exactly_the_candidates_whose_entry_is_another_object(default_policy) -> None:  # type: ignore[no-untyped-def]
    # What the builder records is what a scan of the two perf tuples finds: the columns derived
    # from the last tuple are updated at those indices alone (scheduler.framework.state).
    rng = random.Random(5)
    regions = _regions(5)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    live: dict[str, RegionLiveState] = {}
    now = NOW
    previous = builder.build(now).perf
    for _ in range(80):
        now += rng.choice((0.5, 1.0, 7.0))
        for r in regions:
            roll = rng.random()
            if roll < 0.1:
                live.pop(r.name, None)
            elif roll < 0.5 or r.name not in live:
                pools = dict(live[r.name].pools) if r.name in live and rng.random() < 0.5 else {}
                # one pool changes, or an equal copy of a state is published, or all of them anew
                for p in r.pools:
                    if not pools or rng.random() < 0.5:
                        pools[p.name] = PoolLiveState(running=rng.choice((0, 3)), arrival_rate=rng.choice((0.0, 1.5)))
                live[r.name] = RegionLiveState(r.name, True, now, pools)
        snapshot = builder.build(now, live=dict(live))
        delta = snapshot.delta
        assert delta is not None and delta.perf_since is previous
        scanned = [i for i, (a, b) in enumerate(zip(previous, snapshot.perf, strict=True)) if a is not b]
        assert list(delta.perf) == scanned
        assert ("perf" in delta.changed) == bool(scanned)
        assert (snapshot.perf is previous) == (not scanned)
        previous = snapshot.perf


def test_entries_from_memoized_operating_points_equal_fresh_ones_under_binding_caps(default_policy) -> None:  # type: ignore[no-untyped-def]
    # The builder keeps the step model's coefficients per (candidate, batch, context): an entry
    # made from them is the one a builder that never computed that point makes, on a pool whose
    # power cap binds (350 W on an H100) and on one whose cap does not (the L4's TDP).
    rng = random.Random(7)
    capped_pool = {**pool("h100", "H100-80GB"), "power_cap_w": 350.0}
    regions = (region("a", pools=[capped_pool, pool("l4", "L4", count=4)]),)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    assert any(cap is not None for cap in builder.caps)
    for _ in range(300):
        state = PoolLiveState(running=rng.choice((0, 1, 8, 60, 300)), queue_depth=rng.choice((0, 4)),
                              kv_cache_usage=rng.choice((0.0, 0.2, 0.96)), arrival_rate=rng.random() * 3,
                              prompt_tokens_rate=rng.random() * 3000)
        for c in builder.candidates:
            kept = builder.perf_of(c, rng.choice((state, None)))
            assert kept == SnapshotBuilder(compile_fleet(regions),
                                           compile_policy(default_policy)).perf_of(c, None if not kept.live else state)


def test_a_builder_for_some_models_follows_their_candidates_alone(default_policy) -> None:  # type: ignore[no-untyped-def]
    # The simulator's builder (``models``: the workload's one model): that model's candidates
    # get the entries of a builder for every model, build after build; the others keep the
    # nominal entry of a pool whose state is unknown.
    rng = random.Random(3)
    two_models = [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072},
                  {"name": "llama-3.2-3b", "precision": "bf16", "max_context": 131072}]
    regions = tuple(region(f"r{i}", pools=[pool("h100", "H100-80GB", models=two_models), pool("l4", "L4", count=4)])
                    for i in range(3))
    some = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy), models=frozenset({"llama-3.1-8b"}))
    every = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    now = NOW
    for _ in range(40):
        now += rng.choice((0.5, 1.0, 7.0))
        live = {r.name: RegionLiveState(r.name, True, now, {p.name: PoolLiveState(
            running=rng.choice((0, 3, 30)), arrival_rate=rng.choice((0.0, 1.5))) for p in r.pools}) for r in regions}
        followed, full = some.build(now, live=live), every.build(now, live=live)
        for c in some.candidates:
            if c.deployment.name == "llama-3.1-8b":
                assert followed.perf[c.index] == full.perf[c.index]
            else:
                assert followed.perf[c.index] == some.perf_of(c, None)
                assert not followed.perf[c.index].live


def test_the_freshness_the_builder_records_is_what_the_plugins_would_judge(default_policy) -> None:  # type: ignore[no-untyped-def]
    # ``fresh_pools`` hands the region-health and pool-served plugins the builder's judgement of
    # each region's freshness (``SnapshotDelta``): it must be what judging the snapshot itself
    # gives, and a copy of the snapshot with another clock, live mapping or policy must be
    # judged again.
    rng = random.Random(5)
    regions = _regions(5)
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(default_policy))
    stricter = default_policy.model_copy(update={"max_age": default_policy.max_age.model_copy(
        update={"region_state": 0.5})})
    live: dict[str, RegionLiveState] = {}
    now = NOW
    names = [r.name for r in regions]
    for _ in range(80):
        now += rng.choice((0.5, 1.0, 7.0))
        for r in regions:
            roll = rng.random()
            if roll < 0.1:
                live.pop(r.name, None)
            elif roll < 0.6 or r.name not in live:
                live[r.name] = RegionLiveState(r.name, rng.random() < 0.9, now - rng.choice((0.0, 0.8)),
                                               {p.name: PoolLiveState(running=rng.choice((0, 3))) for p in r.pools})
        snapshot = builder.build(now, live=dict(live))
        max_age = default_policy.max_age.region_state
        expected = judge_fresh(dict(live), names, now, max_age)
        assert fresh_pools(snapshot) == expected
        assert expected[1] == all(
            (s := live.get(n)) is not None and s.healthy and now - s.observed_at <= max_age for n in names)
        for copy in (dataclasses.replace(snapshot, now=now + 6.0),
                     dataclasses.replace(snapshot, live={n: s for n, s in live.items() if n != "r0"}),
                     dataclasses.replace(snapshot, policy=stricter)):
            assert fresh_pools(copy) == judge_fresh(copy.live, names, copy.now, copy.policy.max_age.region_state)
