"""Table-driven tests for the scorers and the picker: which candidate each one prefers."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.framework.latency import request_view
from scheduler.framework.plugin import Abstain
from scheduler.plugins.filters.model_available import ModelAvailableFilter
from scheduler.plugins.pickers.max_score import MaxScorePicker
from scheduler.plugins.scorers.carbon import CarbonScorer
from scheduler.plugins.scorers.energy import EnergyScorer
from scheduler.plugins.scorers.latency import LatencyScorer
from scheduler.plugins.scorers.load import LoadScorer
from scheduler.plugins.scorers.price import PriceScorer
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
    best: str | None  # None: the scorer abstains
    request: Request = field(default_factory=req)
    signals: list = field(default_factory=list)
    live: list = field(default_factory=list)


def live(name: str, pool_name: str = "h100", *, queue: int = 0, kv: float = 0.0, age_s: float = 0.0) -> RegionLiveState:
    return RegionLiveState(region=name, healthy=True, observed_at=NOW - age_s,
                           pools={pool_name: PoolLiveState(queue_depth=queue, kv_cache_usage=kv)})


CASES = [
    Case("carbon: the clean grid wins", CarbonScorer(), [region("dirty", zone="D"), region("clean", zone="C")],
         best="clean/h100", signals=[carbon("D", 600), carbon("C", 30)]),
    Case("carbon: PUE counts", CarbonScorer(),
         [region("a", zone="A", pue=2.0), region("b", zone="B", pue=1.05)], best="b/h100",
         signals=[carbon("A", 100), carbon("B", 150)]),
    Case("carbon: a stale signal makes it abstain", CarbonScorer(), [region("a", zone="A"), region("b", zone="B")],
         best=None, signals=[carbon("A", 100), carbon("B", 50, age_s=3 * 3600)]),
    Case("carbon: a missing signal makes it abstain", CarbonScorer(), [region("a", zone="A"), region("b", zone="B")],
         best=None, signals=[carbon("A", 100)]),
    Case("energy: H200's bandwidth spends less per token than A100",
         EnergyScorer(), [region("r", pools=[pool("a100", "A100-80GB"), pool("h200", "H200-141GB")])], best="r/h200"),
    Case("latency: the nearby region", LatencyScorer(),
         [region("us", lat=39.0, lon=-77.5), region("jp", lat=35.7, lon=139.7)], best="jp/h100",
         request=req(client_location=GeoPoint(35.68, 139.69))),
    Case("load: the idle pool", LoadScorer(), [region("busy"), region("idle")], best="idle/h100",
         live=[live("busy", queue=64, kv=0.9), live("idle")]),
    Case("load: stale live state makes it abstain", LoadScorer(), [region("a"), region("b")], best=None,
         live=[live("a"), live("b", age_s=30)]),
    Case("price: the cheap region", PriceScorer(), [region("dear", price=0.4), region("cheap", price=0.05)],
         best="cheap/h100"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_scorer(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(case.regions, carbon_signals=case.signals, live=case.live)
    base, _ = ModelAvailableFilter().select(case.request, snapshot)
    view = request_view(case.request, snapshot, base)
    result = case.scorer.score(view, slice(None))  # type: ignore[attr-defined]
    if case.best is None:
        assert isinstance(result, Abstain)
        return
    assert not isinstance(result, Abstain)
    values = np.asarray(result)
    assert values.min() >= 0.0 and values.max() <= 1.0
    print(case.name, {snapshot.candidates[i].key: round(float(v), 3) for i, v in zip(base, values, strict=True)})
    assert snapshot.candidates[base[int(values.argmax())]].key == case.best


def test_abstention_reports_the_signal_age(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot([region("a", zone="A"), region("b", zone="B")],
                             carbon_signals=[carbon("A", 100), carbon("B", 50, age_s=9000)])
    view = request_view(req(), snapshot, ModelAvailableFilter().select(req(), snapshot)[0])
    result = CarbonScorer().score(view, slice(None))
    assert isinstance(result, Abstain)
    assert result.signal == "carbon"
    assert result.age_s == pytest.approx(9000.0)
    assert result.max_age_s == 7200.0  # the default policy's max_age.carbon: 2h


@pytest.mark.parametrize(
    ("totals", "expected_first"),
    [([0.2, 0.9, 0.5], 1), ([0.7, 0.1], 0), ([0.3], 0)],
)
def test_picker_orders_by_total(totals: list[float], expected_first: int) -> None:
    order = MaxScorePicker().pick(np.asarray(totals), random.Random(0))
    assert int(order[0]) == expected_first
    assert sorted(order.tolist()) == list(range(len(totals)))
    assert [totals[i] for i in order] == sorted(totals, reverse=True)


def test_picker_breaks_exact_ties_by_the_seeded_rng() -> None:
    totals = np.asarray([0.5, 0.5, 0.5, 0.5, 0.1])
    firsts = {int(MaxScorePicker().pick(totals, random.Random(seed))[0]) for seed in range(40)}
    assert firsts == {0, 1, 2, 3}  # every tied candidate can win; the loser never does
    again = [MaxScorePicker().pick(totals, random.Random(3)).tolist() for _ in range(2)]
    assert again[0] == again[1]  # same seed, same order
