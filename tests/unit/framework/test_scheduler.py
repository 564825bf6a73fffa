"""The decision function: three layers, an objective in USD over physical quantities,
fallbacks with ages, the kill switch, purity."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from scheduler.config.loader import validate
from scheduler.config.schema import PolicyConfig
from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView
from scheduler.framework.registry import Registry
from scheduler.framework.scheduler import KILL_SWITCH, Scheduler
from scheduler.plugins import default_scheduler_registry, register_all
from scheduler.signal_check import UPPER_BOUND_G_PER_KWH
from scheduler.testing import region as one_region
from scheduler.testing import request, shipped_policy, snapshot
from scheduler.types import Decision, GeoPoint, Request
from tests.literals import carbon, pool, region


def req(**overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": "t", "model": "llama-3.1-8b", "prompt_tokens": 500, "max_tokens": 200,
                                 "client_location": GeoPoint(50.0, 8.0)}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


NEAR_DIRTY = region("near-dirty", "EU", zone="ND", lat=50.1, lon=8.7)
FAR_CLEAN = region("far-clean", "EU", zone="FC", lat=64.1, lon=-21.9)


def test_fresh_carbon_ranks_the_clean_region_first(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([NEAR_DIRTY, FAR_CLEAN], carbon_signals=[carbon("ND", 700), carbon("FC", 20)])
    decision = scheduler.schedule(req(), snapshot)
    assert decision.chosen is not None and decision.chosen.candidate.region.name == "far-clean"
    assert decision.energy_ranking
    assert decision.fallbacks == ()  # default uses no live-state scorer, so none abstained
    chosen = decision.chosen
    energy_j = decision.energy.energy_j  # type: ignore[union-attr]
    assert chosen.quantities["carbon-scorer"] == pytest.approx(energy_j * 20 * 1.2 / 3.6e6)
    rate = dict(zip(decision.scorer_names, decision.rates, strict=True))["carbon-scorer"]
    assert rate == pytest.approx(3000 / 1e6)  # default prices carbon at 3000 USD/tCO2e: USD per gram
    assert chosen.costs["carbon-scorer"] == pytest.approx(rate * chosen.quantities["carbon-scorer"])
    assert chosen.total == pytest.approx(sum(chosen.costs.values()))
    assert dict(zip(decision.scorer_names, decision.units, strict=True)) == {
        "carbon-scorer": "gCO2e", "price-scorer": "USD", "affinity-scorer": "J", "ttft-scorer": "ms",
            "slo-risk-scorer": "miss"}


def test_stale_carbon_falls_back_to_the_performance_order(scheduler, make_snapshot, shipped) -> None:  # type: ignore[no-untyped-def]
    stale = [carbon("ND", 700, age_s=3 * 3600), carbon("FC", 20, age_s=3 * 3600)]
    decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN], carbon_signals=stale))
    carbon_fallbacks = [f for f in decision.fallbacks if f.signal == "carbon"]
    assert len(carbon_fallbacks) == 1
    assert carbon_fallbacks[0].age_s == 3 * 3600 and carbon_fallbacks[0].max_age_s == 7200
    assert not decision.energy_ranking
    assert "carbon-scorer" not in decision.scorer_names and "energy-scorer" not in decision.scorer_names
    assert decision.chosen is not None and decision.chosen.candidate.region.name == "near-dirty"
    # the same ranking latency-first gives with fresh data
    latency_first = make_snapshot([NEAR_DIRTY, FAR_CLEAN], policy=shipped.policy("latency-first"),
                                  carbon_signals=[carbon("ND", 700), carbon("FC", 20)])
    assert decision.ranked_candidates == scheduler.schedule(req(), latency_first).ranked_candidates


def test_a_stale_value_never_moves_a_score(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    def totals(fc_value: float) -> tuple[float, ...]:
        signals = [carbon("ND", 700, age_s=9000), carbon("FC", fc_value, age_s=9000)]
        decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN], carbon_signals=signals))
        return tuple(float(t) for t in decision.totals)

    assert totals(1.0) == totals(5000.0)


def test_kill_switch_uses_the_performance_order(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    fresh = [carbon("ND", 700), carbon("FC", 20)]
    decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN], carbon_signals=fresh,
                                                       energy_routing_enabled=False))
    assert KILL_SWITCH in [f.signal for f in decision.fallbacks]
    assert not decision.energy_ranking and "carbon-scorer" not in decision.scorer_names
    assert decision.chosen is not None and decision.chosen.candidate.region.name == "near-dirty"


def test_compliance_leaves_nothing_and_every_region_is_explained(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    regions = [region("us-a", "US"), region("jp-b", "JP")]
    decision = scheduler.schedule(req(allowed_jurisdictions=frozenset({"EU"})), make_snapshot(regions))
    assert not decision.schedulable and decision.chosen is None
    assert {(r.candidate.region.name, r.plugin) for r in decision.rejected} == {
        ("us-a", "residency-filter"), ("jp-b", "residency-filter")}


def test_the_ranking_is_complete_for_failover(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    regions = [region(f"r{i}", zone=f"Z{i}", lat=40 + i, lon=i) for i in range(5)]
    signals = [carbon(f"Z{i}", 100 + 50 * i) for i in range(5)]
    decision = scheduler.schedule(req(), make_snapshot(regions, carbon_signals=signals))
    assert len(decision.ranked) == 5
    assert [s.total for s in decision.ranked] == sorted(s.total for s in decision.ranked)  # lowest cost first
    assert decision.ranked_candidates[0] == decision.chosen.candidate  # type: ignore[union-attr]


def test_long_context_goes_to_h200_and_the_matcher_never_empties(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    mixed = region("m", pools=[pool("h100", "H100-80GB"), pool("h200", "H200-141GB")])
    decision = scheduler.schedule(req(prompt_tokens=100_000, workload_class="batch"), make_snapshot([mixed]))
    assert decision.chosen is not None and decision.chosen.candidate.gpu.name == "H200-141GB"
    only_h100 = region("o", pools=[pool("h100", "H100-80GB")])
    decision = scheduler.schedule(req(prompt_tokens=40_000, workload_class="batch"), make_snapshot([only_h100]))
    assert decision.chosen is not None and decision.chosen.candidate.gpu.name == "H100-80GB"


def test_same_inputs_same_decision(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    regions = [region(f"r{i}", zone=f"Z{i}") for i in range(4)]  # identical regions: exact ties
    snapshot = make_snapshot(regions, carbon_signals=[carbon(f"Z{i}", 100) for i in range(4)])
    orders = [
        [c.key for c in Scheduler.from_registry(default_scheduler_registry(), rng=random.Random(11))
         .schedule(req(), snapshot).ranked_candidates]
        for _ in range(3)
    ]
    assert orders[0] == orders[1] == orders[2]


def test_every_plugin_is_timed_and_the_decision_is_explained(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    from scheduler.framework.explain import explain_dict, explain_table

    decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN],
                                                       carbon_signals=[carbon("ND", 700), carbon("FC", 20)]))
    assert {"model-filter", "residency-filter", "slo-reachable", "carbon-scorer", "ttft-scorer"} <= set(
        decision.plugin_timings_ns)
    explained = explain_dict(decision)
    assert explained["chosen"]["region"] == "far-clean"
    assert explained["chosen"]["energy"]["energy_j"] > 0
    table = explain_table(decision)
    assert "far-clean" in table and "carbon gCO2e" in table and "cost USD" in table
    assert explained["units"]["carbon-scorer"] == "gCO2e" and explained["total_unit"] == "USD"
    assert explained["candidates"][0]["scores"]["ttft-scorer"] > 0


def test_latency_first_runs_no_energy_plugin(scheduler, make_snapshot, shipped) -> None:  # type: ignore[no-untyped-def]
    # no carbon signal at all: a policy that does not use carbon neither reads nor misses it
    snapshot = make_snapshot([NEAR_DIRTY, FAR_CLEAN], policy=shipped.policy("latency-first"))
    decision = scheduler.schedule(req(), snapshot)
    assert decision.fallbacks == () and decision.energy_ranking
    assert decision.scorer_names == ("ttft-scorer",)
    assert "carbon-scorer" not in decision.plugin_timings_ns
    assert decision.chosen is not None and decision.chosen.candidate.region.name == "near-dirty"


def test_nonsense_carbon_values_are_priced_at_the_bound_never_used(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    future = carbon("FC", 20, age_s=-3600)
    for signal, why in ((carbon("FC", float("nan")), "not a finite number"),
                        (carbon("FC", -5.0), "outside the physical bounds"),
                        (carbon("FC", float("inf")), "not a finite number"),
                        (carbon("FC", 1e6), "outside the physical bounds"),
                        (future, "future")):
        decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN],
                                                           carbon_signals=[carbon("ND", 700), signal]))
        assert decision.energy_ranking, signal.value
        (fallback,) = decision.fallbacks
        assert fallback.signal == "carbon" and why in fallback.detail
        assert (fallback.key, fallback.bound) == ("FC", UPPER_BOUND_G_PER_KWH)
        assert fallback.candidates == tuple(c.key for c in decision.fleet if c.region.grid_zone == "FC")
        # Priced at 1,100 g/kWh, the clean far region loses to the near one at 700.
        assert decision.ranked_candidates[0].region.grid_zone == "ND"
    # Both zones unusable: nothing to rank the bounds against, the performance order ranks.
    decision = scheduler.schedule(req(), make_snapshot([NEAR_DIRTY, FAR_CLEAN],
                                                       carbon_signals=[carbon("ND", float("nan")), future]))
    assert not decision.energy_ranking and decision.fallbacks[0].bound is None


def test_unserved_model_names_do_not_grow_the_framework_state(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([NEAR_DIRTY, FAR_CLEAN], carbon_signals=[carbon("ND", 700), carbon("FC", 20)])
    scheduler.schedule(req(), snapshot)
    state = scheduler._compile(snapshot.policy).state
    models, frames = set(state.models), set(state.frames)
    assert models and frames
    for i in range(200):
        decision = scheduler.schedule(req(model=f"no-such-model-{i}"), snapshot)
        assert not decision.schedulable
    assert set(state.models) == models and set(state.frames) == frames



@dataclass(frozen=True)
class NotFiniteScorer(Plugin):
    """The TTFT in ms, but NaN on the last survivor."""

    TYPE: ClassVar[str] = "not-finite-scorer"
    UNIT: ClassVar[str] = "ms"
    QUANTITY: ClassVar[str] = "nothing"
    ENERGY_LAYER: ClassVar[bool] = False

    def score(self, view: RequestView, cols: None, positions: Positions) -> FloatArray | Abstain:
        ms: FloatArray = view.ttft_s[positions] * 1000.0
        ms[-1] = float("nan")
        return ms


def decide_with_not_finite_scorer(listed: bool) -> Decision:
    registry = register_all(Registry())
    registry.scorer(NotFiniteScorer.TYPE, NotFiniteScorer)
    raw = json.loads(shipped_policy("default").model_dump_json())
    if listed:
        raw["scorers"].append({"type": NotFiniteScorer.TYPE,
                               "rate": {"interactive": "1 USD/h", "batch": "1 USD/h", "deferrable": 0}})
    policy = validate(PolicyConfig, raw, "<not-finite example>")
    snap = snapshot(one_region("near", lat=40.7, lon=-74.0, carbon=300),
                    one_region("far", lat=35.7, lon=139.7, carbon=300), policy=policy)
    return Scheduler.from_registry(registry).schedule(request(client=(40.7, -74.0)), snap)


def test_a_scorer_that_gives_a_non_finite_quantity_is_dropped_and_recorded() -> None:
    # The objective's quantities are written survivor by survivor (Scheduler._evaluate): a
    # scorer whose quantity is not finite on some survivor leaves the objective, the costs are
    # those of the objective without it, and the decision holds the quantities scorer by scorer.
    with_it, without = decide_with_not_finite_scorer(True), decide_with_not_finite_scorer(False)
    assert [(f.signal, f.scorer) for f in with_it.fallbacks] == [("nothing", NotFiniteScorer.TYPE)]
    assert with_it.scorer_names == without.scorer_names
    assert np.array_equal(with_it.totals, without.totals)
    assert np.asarray(with_it.quantities).shape == (len(without.scorer_names), len(without.totals))
    assert np.array_equal(with_it.quantities, without.quantities)
