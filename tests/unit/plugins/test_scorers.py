"""Table-driven tests for the scorers and the picker: each scorer's physical quantity, which
candidate has the least of it, which are priced at a bound (their signal unusable), and that a
candidate's quantity does not depend on who else is in the list."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.framework.plugin import Abstain, Bounded
from scheduler.framework.predict import request_view
from scheduler.framework.state import prepared, selected
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.pickers.lowest_cost import LowestCostPicker
from scheduler.plugins.scorers.carbon import CarbonScorer
from scheduler.plugins.scorers.energy import EnergyScorer
from scheduler.plugins.scorers.price import PriceScorer
from scheduler.plugins.scorers.queue import QueueScorer
from scheduler.plugins.scorers.slo_risk import SloRiskScorer, normal_sf
from scheduler.plugins.scorers.ttft import TtftScorer
from scheduler.signal_check import UPPER_BOUND_G_PER_KWH
from scheduler.types import GeoPoint, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region


def req(**overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": "t", "model": "llama-3.1-8b", "prompt_tokens": 500, "max_tokens": 200}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


@dataclass
class Case:
    name: str
    scorer: object
    regions: list
    least: str | None  # the candidate with the least of the quantity; None: the scorer abstains
    request: Request = field(default_factory=req)
    signals: list = field(default_factory=list)
    live: list = field(default_factory=list)
    # the candidates priced at a bound (their signal unusable)
    bounded: frozenset[str] = frozenset()


def live(name: str, pool_name: str = "h100", *, queue: int = 0, running: int = 0, kv: float = 0.0,
         age_s: float = 0.0) -> RegionLiveState:
    return RegionLiveState(region=name, healthy=True, observed_at=NOW - age_s,
                           pools={pool_name: PoolLiveState(queue_depth=queue, running=running, kv_cache_usage=kv)})


CASES = [
    Case("carbon: the clean grid", CarbonScorer(), [region("dirty", zone="D"), region("clean", zone="C")],
         least="clean/h100", signals=[carbon("D", 600), carbon("C", 30)]),
    Case("carbon: PUE counts", CarbonScorer(),
         [region("a", zone="A", pue=2.0), region("b", zone="B", pue=1.05)], least="b/h100",
         signals=[carbon("A", 100), carbon("B", 150)]),
    Case("carbon: a stale signal is priced at the bound, never its old value", CarbonScorer(),
         [region("a", zone="A"), region("b", zone="B")], least="a/h100",
         signals=[carbon("A", 100), carbon("B", 50, age_s=3 * 3600)], bounded=frozenset({"b/h100"})),
    Case("carbon: a missing signal is priced at the bound", CarbonScorer(),
         [region("a", zone="A"), region("b", zone="B")], least="a/h100", signals=[carbon("A", 100)],
         bounded=frozenset({"b/h100"})),
    Case("carbon: no usable signal at all makes it abstain", CarbonScorer(),
         [region("a", zone="A"), region("b", zone="B")], least=None,
         signals=[carbon("A", 100, age_s=3 * 3600), carbon("B", 50, age_s=3 * 3600)]),
    Case("energy: H200's bandwidth spends less than A100's", EnergyScorer(),
         [region("r", pools=[pool("a100", "A100-80GB"), pool("h200", "H200-141GB")])], least="r/h200"),
    Case("ttft: the nearby region", TtftScorer(),
         [region("us", lat=39.0, lon=-77.5), region("jp", lat=35.7, lon=139.7)], least="jp/h100",
         request=req(client_location=GeoPoint(35.68, 139.69))),
    Case("queue: the idle pool", QueueScorer(), [region("busy"), region("idle")], least="idle/h100",
         live=[live("busy", queue=64, running=2048, kv=0.97), live("idle")]),
    Case("queue: stale live state is priced at the TTFT budget", QueueScorer(), [region("a"), region("b")],
         least="a/h100", live=[live("a"), live("b", age_s=30)], bounded=frozenset({"b/h100"})),
    Case("queue: no fresh live state makes it abstain", QueueScorer(), [region("a"), region("b")], least=None,
         live=[live("a", age_s=30), live("b", age_s=30)]),
    Case("price: the cheap region", PriceScorer(), [region("dear", price=0.4), region("cheap", price=0.05)],
         least="cheap/h100"),
    Case("slo risk: the region far inside the budget", SloRiskScorer(),
         [region("us", lat=39.0, lon=-77.5), region("jp", lat=35.7, lon=139.7)], least="jp/h100",
         request=req(client_location=GeoPoint(35.68, 139.69), ttft_slo_ms=250)),
]


def scored(scorer, regions, request, signals, live_states, make_snapshot, bounds=None):  # type: ignore[no-untyped-def]
    """The scorer's answer, and the candidates' keys in its order."""
    snapshot = make_snapshot(regions, carbon_signals=signals, live=live_states, carbon_bounds=bounds)
    base, _ = selected(ModelIndex(), request, snapshot)
    view = request_view(request, snapshot, base)
    result = scorer.score(view, prepared(scorer, snapshot, base), slice(None))
    return result, [snapshot.candidates[i].key for i in base]


def quantities(scorer, regions, request, signals, live_states, make_snapshot, bounds=None):  # type: ignore[no-untyped-def]
    result, keys = scored(scorer, regions, request, signals, live_states, make_snapshot, bounds)
    if isinstance(result, Abstain):
        return result
    values = result.quantities if isinstance(result, Bounded) else result
    return dict(zip(keys, np.asarray(values).tolist(), strict=True))


def bounded_keys(scorer, regions, request, signals, live_states, make_snapshot) -> set[str]:  # type: ignore[no-untyped-def]
    result, keys = scored(scorer, regions, request, signals, live_states, make_snapshot)
    return {keys[i] for i in result.bounded.tolist()} if isinstance(result, Bounded) else set()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scorer(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    result = quantities(case.scorer, case.regions, case.request, case.signals, case.live, make_snapshot)
    if case.least is None:
        assert isinstance(result, Abstain)
        return
    assert not isinstance(result, Abstain)
    assert all(v >= 0 and np.isfinite(v) for v in result.values())
    assert min(result, key=result.__getitem__) == case.least
    assert bounded_keys(case.scorer, case.regions, case.request, case.signals, case.live, make_snapshot) == case.bounded
    # A quantity, not a rank: each candidate keeps its value when the others leave the list
    # (a bounded one alone has no usable signal beside it: the scorer then abstains).
    for key, value in result.items():
        alone = [r for r in case.regions if any(f"{r.name}/{p.name}" == key for p in r.pools)]
        single = quantities(case.scorer, alone, case.request, case.signals,
                            [s for s in case.live if s.region == alone[0].name], make_snapshot)
        if key in case.bounded:
            assert isinstance(single, Abstain)
            continue
        assert not isinstance(single, Abstain)
        assert single[key] == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize(("bounds", "expected"), [
    (None, UPPER_BOUND_G_PER_KWH),  # nothing known of the zone: the fleet-wide bound
    ({"B": 640.0}, 640.0),  # the zone's highest accepted value over the policy's window
])
def test_a_stale_zone_is_priced_at_its_bound_and_named(make_snapshot, bounds, expected) -> None:  # type: ignore[no-untyped-def]
    regions = [region("a", zone="A", pue=1.1), region("b", zone="B", pue=1.3)]
    signals = [carbon("A", 100), carbon("B", 50, age_s=3 * 3600)]
    result, keys = scored(CarbonScorer(), regions, req(), signals, [], make_snapshot, bounds)
    assert isinstance(result, Bounded)
    energy = quantities(EnergyScorer(), regions, req(), signals, [], make_snapshot)
    at_b = keys.index("b/h100")
    assert float(result.quantities[at_b]) == pytest.approx(energy["b/h100"] * expected * 1.3 / 3.6e6)
    assert float(result.quantities[keys.index("a/h100")]) == pytest.approx(energy["a/h100"] * 100 * 1.1 / 3.6e6)
    (note,) = result.notes
    assert (note.signal, note.key, note.bound, note.bound_unit) == ("carbon", "B", expected, "gCO2e/kWh")
    assert note.age_s == pytest.approx(3 * 3600) and note.max_age_s == 7200.0


def test_carbon_is_energy_times_intensity_times_pue(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a", zone="A", pue=1.3)], carbon_signals=[carbon("A", 250)])
    base, _ = selected(ModelIndex(), req(), snapshot)
    view = request_view(req(), snapshot, base)
    grams = CarbonScorer().score(view, prepared(CarbonScorer(), snapshot, base), slice(None))
    assert not isinstance(grams, Abstain)
    assert float(grams[0]) == pytest.approx(float(view.energy_j[0]) * 250 * 1.3 / 3.6e6)
    assert CarbonScorer.UNIT == "gCO2e" and EnergyScorer.UNIT == "J" and TtftScorer.UNIT == "ms"


def test_abstention_reports_the_signal_age(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    result = quantities(CarbonScorer(), [region("a", zone="A"), region("b", zone="B")], req(),
                        [carbon("A", 100, age_s=9000), carbon("B", 50, age_s=9000)], [], make_snapshot)
    assert isinstance(result, Abstain)
    assert result.signal == "carbon"
    assert result.age_s == pytest.approx(9000.0)
    assert result.max_age_s == 7200.0  # the default policy's max_age.carbon: 2h


@pytest.mark.parametrize(
    ("costs", "expected_first"),
    [([0.2, 0.9, 0.5], 0), ([0.7, 0.1], 1), ([0.3], 0)],
)
def test_picker_orders_by_cost(costs: list[float], expected_first: int) -> None:
    order = LowestCostPicker().pick(np.asarray(costs), np.arange(len(costs), dtype=np.uint64))
    assert int(order[0]) == expected_first
    assert [costs[i] for i in order] == sorted(costs)


def test_picker_breaks_exact_ties_by_the_tiebreak_key() -> None:
    costs = np.asarray([0.5, 0.5, 0.5, 0.1])
    order = LowestCostPicker().pick(costs, np.asarray([30, 10, 20, 99], dtype=np.uint64))
    assert order.tolist() == [3, 1, 2, 0]


def test_slo_risk_is_the_chance_of_a_miss(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a")])
    base, _ = selected(ModelIndex(), req(), snapshot)
    ttft_ms = float(request_view(req(), snapshot, base).ttft_s[0]) * 1000
    for budget_ms, expected in ((ttft_ms, 0.5), (ttft_ms * np.exp(0.3), 1 - 0.8413447), (ttft_ms * np.exp(-0.6), 0.9772499)):
        request = req(ttft_slo_ms=budget_ms)
        # no live state: no queue, so the spread is the physics' alone
        risk = SloRiskScorer(ttft_log_sigma=0.3).score(request_view(request, snapshot, base), None, slice(None))
        assert not isinstance(risk, Abstain)
        assert float(risk[0]) == pytest.approx(expected, abs=1e-6)
    z = np.linspace(-8, 8, 161)
    assert np.all(np.diff(normal_sf(z)) < 0) and normal_sf(np.array([0.0]))[0] == pytest.approx(0.5)
