"""Cold pools (issue 31.2): the cold-pool filter keeps a pool with no warm replica only for
requests whose TTFT budget allows its cold start, and a decision prices the cold start: its
seconds in the TTFT, and, where the request wakes the pool, its joules in the energy and their
grams in the carbon scorer's gCO2e. A request to a warm pool is charged nothing extra."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from scheduler.config.schema import ModelDeployment, PoolConfig
from scheduler.energy.cold_start import ColdStart, cold_start
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.framework.explain import explain_dict, explain_table
from scheduler.framework.predict import request_view
from scheduler.framework.state import prepared, selected
from scheduler.plugins.filters.cold_pool import ColdPoolFilter
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.types import GeoPoint, PoolLiveState, RegionLiveState, Request
from tests.literals import NOW, carbon, pool, region


def pool_cold_start(pool: PoolConfig, model: ModelDeployment | None = None) -> ColdStart:
    """The cold start of ``model`` (the pool's first, by default) on ``pool``, as the snapshot
    builder computes it for its candidate."""
    model = model or pool.models[0]
    return cold_start(GPU_CATALOGUE[pool.gpu], MODEL_CATALOGUE[model.name], model.precision, model.tensor_parallel,
                      pool.cold_start_s, pool.cold_start_j)

MODEL = "llama-3.1-8b"
# Where the unit tests' regions are (tests.literals.region): no RTT to speak of.
CLIENT = GeoPoint(40.0, -75.0)


def req(**overrides: object) -> Request:
    fields: dict[str, object] = {"request_id": "t", "model": MODEL, "prompt_tokens": 500, "max_tokens": 100,
                                 "client_location": CLIENT}
    fields.update(overrides)
    return Request(**fields)  # type: ignore[arg-type]


def live(name: str, **pools: tuple[int | None, int | None]) -> RegionLiveState:
    """A fresh, idle region state: per pool, (warm replicas, starting replicas)."""
    return RegionLiveState(region=name, healthy=True, observed_at=NOW, pools={
        p: PoolLiveState(replicas=warm, starting_replicas=starting) for p, (warm, starting) in pools.items()})


# Two pools of one region, same GPU: "a" is cold or warm as the case says, "b" always warm.
FLEET = [region("r", pools=[pool("a", "H100-80GB"), pool("b", "H100-80GB")])]
COLD_START = pool_cold_start(FLEET[0].pools[0], FLEET[0].pools[0].models[0])
# A pool that says what its cold start costs.
QUICK = [region("q", pools=[{**pool("a", "H100-80GB"), "cold_start_s": 5, "cold_start_j": 400.0}])]


@dataclass
class Case:
    name: str
    request: Request
    live: list[RegionLiveState]
    kept: set[str]
    reasons: dict[str, str] = field(default_factory=dict)
    regions: list = field(default_factory=lambda: FLEET)


CASES = [
    Case("warm pools: every one kept", req(), [live("r", a=(2, 0), b=(1, 0))], kept={"r/a", "r/b"}),
    Case("no replica counts published: counted warm", req(), [live("r", a=(None, None), b=(None, None))],
         kept={"r/a", "r/b"}),
    Case("cold pool, interactive (2 s budget)", req(), [live("r", a=(0, 0), b=(1, 0))], kept={"r/b"},
         reasons={"r/a": f"no warm replica (none starting): cold start {COLD_START.seconds:.0f} s"}),
    Case("starting pool, interactive", req(), [live("r", a=(0, 1), b=(1, 0))], kept={"r/b"},
         reasons={"r/a": "no warm replica (one starting)"}),
    Case("cold pool, deferrable (its class budget, an hour, is its deadline)", req(workload_class="deferrable"),
         [live("r", a=(0, 0), b=(1, 0))], kept={"r/a", "r/b"}),
    Case("cold pool, batch (30 s budget) shorter than the cold start", req(workload_class="batch"),
         [live("r", a=(0, 0), b=(1, 0))], kept={"r/b"}, reasons={"r/a": "TTFT budget 30150 ms"}),
    Case("cold pool, the request's own TTFT SLO allows the start", req(ttft_slo_ms=COLD_START.seconds * 1e3 + 500),
         [live("r", a=(0, 0), b=(1, 0))], kept={"r/a", "r/b"}),
    Case("cold pool with a 5 s start, interactive SLO of 6 s", req(ttft_slo_ms=6000), [live("q", a=(0, 0))],
         kept={"q/a"}, regions=QUICK),
    Case("cold pool with a 5 s start, interactive SLO of 4 s", req(ttft_slo_ms=4000), [live("q", a=(0, 0))],
         kept=set(), reasons={"q/a": "cold start 5 s"}, regions=QUICK),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_cold_pool_filter(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(case.regions, live=case.live)
    plugin = ColdPoolFilter()
    base, _ = selected(ModelIndex(), case.request, snapshot)
    view = request_view(case.request, snapshot, base)
    cols = prepared(plugin, snapshot, base)
    keep = plugin.keep(view, cols)
    mask = np.ones(len(base), dtype=bool) if keep is None else keep
    keys = [snapshot.candidates[i].key for i in base]
    assert {k for k, m in zip(keys, mask, strict=True) if m} == case.kept
    for position, key in enumerate(keys):
        if not mask[position]:
            fmt, args = plugin.reason(view, cols, position)
            assert case.reasons[key] in fmt.format(*args)


def decide(scheduler, make_snapshot, request: Request, a: tuple[int, int]):  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(FLEET, live=[live("r", a=a, b=(1, 0))], carbon_signals=[carbon("Z-R", 300.0)])
    return scheduler.schedule(request, snapshot)


def by_pool(decision) -> dict[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    return {s.candidate.pool.name: dict(s.quantities) for s in decision.ranked}


@pytest.mark.timeout(60)
def test_a_decision_prices_a_cold_pools_start_and_only_the_request_that_wakes_it_pays(
        scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    # Deferrable: its budget allows the cold start, so the cold pool stays a candidate.
    request = req(workload_class="deferrable")
    warm = decide(scheduler, make_snapshot, request, (1, 0))
    cold = decide(scheduler, make_snapshot, request, (0, 0))
    starting = decide(scheduler, make_snapshot, request, (0, 1))
    pue = FLEET[0].pue
    w, c, s = by_pool(warm)["a"], by_pool(cold)["a"], by_pool(starting)["a"]
    print(f"\ncold start {COLD_START}; pool a warm {w}, cold {c}, starting {s}")
    # Waking the pool: its joules times the zone's intensity and the PUE, in the carbon scorer's grams.
    assert c["carbon-scorer"] - w["carbon-scorer"] == pytest.approx(COLD_START.joules / 3.6e6 * 300.0 * pue)
    # ... and its seconds in the predicted TTFT (ms).
    assert c["ttft-scorer"] - w["ttft-scorer"] == pytest.approx(COLD_START.seconds * 1e3)
    # A pool already starting: the wait, not the wake-up (the request that woke it paid for that).
    assert s["carbon-scorer"] == pytest.approx(w["carbon-scorer"])
    assert s["ttft-scorer"] - w["ttft-scorer"] == pytest.approx(COLD_START.seconds * 1e3)
    # Pool b is warm in all three: charged the same, whatever a's state.
    assert by_pool(cold)["b"] == by_pool(warm)["b"] == by_pool(starting)["b"]
    # The cold pool now costs more than its warm twin, and the request goes to the warm one.
    assert cold.chosen is not None and cold.chosen.candidate.pool.name == "b"
    entry = {e["pool"]: e for e in explain_dict(cold)["candidates"]}
    assert (entry["a"]["warmth"], entry["a"]["wake_j"], entry["a"]["cold_start_s"]) == (
        "cold", COLD_START.joules, COLD_START.seconds)
    assert (entry["b"]["warmth"], entry["b"]["wake_j"]) == ("warm", 0.0)
    assert f"cold +{COLD_START.seconds:.0f} s +{COLD_START.joules:,.0f} J" in explain_table(cold)


@pytest.mark.timeout(60)
def test_the_estimate_of_a_decision_that_wakes_a_pool_includes_the_wake_up(
        scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    request = req(workload_class="deferrable")
    snapshot = make_snapshot(FLEET[:1], live=[live("r", a=(0, 0), b=(0, 0))], carbon_signals=[carbon("Z-R", 300.0)])
    woken = scheduler.schedule(request, snapshot)
    warm = scheduler.schedule(request, make_snapshot(FLEET[:1], live=[live("r", a=(1, 0), b=(1, 0))],
                                                     carbon_signals=[carbon("Z-R", 300.0)]))
    assert woken.energy is not None and warm.energy is not None
    assert woken.energy.cold_start_j == COLD_START.joules and warm.energy.cold_start_j == 0.0
    assert woken.energy.energy_j == pytest.approx(warm.energy.energy_j + COLD_START.joules)
    assert "wakes the pool" in explain_table(woken)
