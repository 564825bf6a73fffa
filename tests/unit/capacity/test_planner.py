"""The capacity planner on fleets and demand small enough to work out by hand."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from scheduler.capacity.assumptions import Assumptions, load_assumptions
from scheduler.capacity.demand import Demand, build_demand, client_groups
from scheduler.capacity.planner import Intensities, Plan, keep_warm, plan_day, pool_options
from scheduler.config.loader import default_region, load_policy, validate
from scheduler.config.schema import PolicyConfig, RegionConfig, SloClass
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.sim.workload import City, Continent, Trace

ROOT = Path(__file__).resolve().parents[3]
DAY = 1685577600.0  # 2023-06-01T00:00Z
OSLO, PARIS, NEW_YORK = (59.91, 10.75), (48.86, 2.35), (40.71, -74.01)
ENERGY = ProfileEnergyModel()


def region(name: str, where: tuple[float, float], gpus: int, jurisdiction: str = "EU") -> RegionConfig:
    raw: dict[str, Any] = {
        "name": name, "jurisdiction": jurisdiction, "grid_zone": name.upper(), "pue": 1.2, "price_per_kwh": 0.1,
        "location": {"lat": where[0], "lon": where[1]}, "endpoint": f"http://127.0.0.1:8000/{name}",
        "pools": [{"name": "h100", "gpu": "H100-80GB", "count": gpus,
                   "models": [{"name": "llama-3.1-8b", "precision": "bf16", "max_context": 131072}]}],
    }
    return validate(RegionConfig, default_region(raw), f"<test region {name}>")


def even_trace() -> Trace:
    """One request a second for an hour, each 1,000 prompt and 200 output tokens: no bursts."""
    n = 3600
    return Trace("even", np.arange(n, dtype=float), np.full(n, 1000), np.full(n, 200))


def clients(*cities: tuple[str, tuple[float, float], str | None]) -> tuple[Continent, ...]:
    return tuple(Continent(name, 1.0, (City(name, *where),), jurisdiction) for name, where, jurisdiction in cities)


def default_policy() -> PolicyConfig:
    return load_policy(ROOT / "policies" / "default.yaml")


def assumptions(rate: float, **changes: Any) -> Assumptions:
    return dataclasses.replace(load_assumptions(), rate=rate, **changes)


def flat(regions: list[RegionConfig], g_per_kwh: dict[str, float], slices: int = 24) -> Intensities:
    values = {r.name: (g_per_kwh[r.name],) * slices for r in regions}
    return Intensities(values, values)


def capacity(policy: PolicyConfig, demand: Demand, a: Assumptions, r: RegionConfig) -> float:
    """Requests/s one H100 replica takes at the target utilisation (the planner's own figure)."""
    groups = client_groups(clients(("paris", PARIS, None)), 0.0)
    return pool_options([r], policy, a, demand, groups, ENERGY)[0].capacity_rps


def run(regions: list[RegionConfig], policy: PolicyConfig, a: Assumptions, continents: tuple[Continent, ...],
        g_per_kwh: dict[str, float], residency_share: float = 0.0) -> Plan:
    demand = build_demand(even_trace(), a, DAY)
    return plan_day(regions, policy, a, demand, client_groups(continents, residency_share),
                    flat(regions, g_per_kwh), ENERGY)


@pytest.mark.timeout(60)
def test_the_cleaner_region_fills_first_and_the_rest_spills_over() -> None:
    clean, dirty = region("clean", OSLO, gpus=2), region("dirty", PARIS, gpus=8)
    policy = default_policy()
    probe = assumptions(rate=1.0)
    cap = capacity(policy, build_demand(even_trace(), probe, DAY), probe, dirty)
    # 3.5 replicas' worth: the clean pool's 2 replicas full, 1.5 -> 2 in the dirty one; the
    # most replicas carry 1.5x (max_headroom) the peak: 5.25 -> clean 2, dirty 4.
    a = assumptions(rate=3.5 * cap)
    plan = run([clean, dirty], policy, a, clients(("paris", PARIS, None)), {"clean": 50.0, "dirty": 500.0})
    assert plan.demand.warm_ratio == pytest.approx(1.0)
    assert set(plan.sizes["planned"][("clean", "h100")]) == {(2, 2)}
    assert set(plan.sizes["planned"][("dirty", "h100")]) == {(2, 4)}
    assert set(plan.sizes["flat"][("dirty", "h100")]) == {(2, 4)}
    assert set(plan.sizes["fixed"][("dirty", "h100")]) == {(8, 8)}
    planned = plan.evaluations["planned"]
    assert planned.totals.unserved_rps_max == pytest.approx(0.0, abs=1e-9)
    assert planned.totals.slo_attainment >= 0.99
    assert [f.demand_rps for f in planned.figures[("clean", "h100")]] == pytest.approx([2 * cap] * 24)
    assert planned.totals.warm_gpu_hours == pytest.approx(4 * 24)
    # Fewer warm replicas, less idle energy: the fixed sizes cost more for the same requests.
    fixed = plan.evaluations["fixed"].totals
    assert fixed.requests == planned.totals.requests
    assert fixed.energy_j > planned.totals.energy_j
    assert fixed.gco2e > planned.totals.gco2e
    # Its own sizes applied again give its own figures.
    assert plan.evaluate(plan.sizes["planned"], a) == planned


@pytest.mark.timeout(60)
def test_an_idle_pool_costs_its_replicas_idle_power_and_nothing_else() -> None:
    clean, dirty = region("clean", OSLO, gpus=2), region("dirty", PARIS, gpus=8)
    a = assumptions(rate=0.5)
    plan = run([clean, dirty], default_policy(), a, clients(("paris", PARIS, None)), {"clean": 50.0, "dirty": 500.0})
    assert set(plan.sizes["planned"][("dirty", "h100")]) == {(0, 0)}
    hour = plan.evaluations["fixed"].figures[("dirty", "h100")][0]
    assert hour.demand_rps == 0.0
    assert hour.energy_j == pytest.approx(8 * 75.0 * 3600)  # 8 replicas x the H100's 75 W idle x 1 h
    assert hour.gco2e == pytest.approx(8 * 75.0 * 3600 * 1.2 / 3.6e6 * 500.0)
    assert hour.usd == pytest.approx(8 * 75.0 * 3600 * 1.2 / 3.6e6 * 0.1)
    assert plan.evaluations["planned"].figures[("dirty", "h100")][0].energy_j == 0.0


@pytest.mark.timeout(60)
def test_a_cleaner_region_out_of_the_ttft_slo_gets_nothing() -> None:
    clean, near = region("clean", OSLO, gpus=8), region("near", NEW_YORK, gpus=8, jurisdiction="US")
    policy = default_policy()
    probe = assumptions(rate=1.0)
    demand = build_demand(even_trace(), probe, DAY)
    option = pool_options([near], policy, probe, demand, client_groups(clients(("ny", NEW_YORK, None)), 0.0),
                          ENERGY)[0]
    # A budget 40 ms above the prefill at a full batch: New York -> New York (2 ms) meets it,
    # New York -> Oslo (~85 ms round trip) cannot.
    budget_ms = (option.replica.prefill_s(option.slots) + 0.040) * 1000
    tight = policy.model_copy(update={"slo": policy.slo.model_copy(update={
        "interactive": SloClass(ttft_ms=budget_ms, ttft_ms_per_1k_prompt_tokens=0, tpot_ms=100)})})
    plan = run([clean, near], tight, assumptions(rate=1.0), clients(("ny", NEW_YORK, None)),
               {"clean": 20.0, "near": 600.0})
    assert set(plan.sizes["planned"][("clean", "h100")]) == {(0, 0)}
    assert set(plan.sizes["planned"][("near", "h100")]) == {(1, 1)}
    assert plan.evaluations["planned"].totals.slo_attainment >= 0.99


@pytest.mark.timeout(60)
def test_residency_keeps_bound_clients_in_their_jurisdiction() -> None:
    clean_us, dirty_eu = region("clean", OSLO, gpus=8, jurisdiction="US"), region("dirty", PARIS, gpus=8)
    policy = default_policy()
    probe = assumptions(rate=1.0)
    cap = capacity(policy, build_demand(even_trace(), probe, DAY), probe, dirty_eu)
    # Europe: half the clients, 40 % of them bound to the EU (20 % of demand); America: half.
    continents = clients(("europe", PARIS, "EU"), ("america", NEW_YORK, None))
    a = assumptions(rate=5 * cap)
    plan = run([clean_us, dirty_eu], policy, a, continents, {"clean": 50.0, "dirty": 500.0}, residency_share=0.4)
    assert set(plan.sizes["planned"][("dirty", "h100")]) == {(1, 2)}  # 1 replica's worth of bound demand, 1.5 peak
    assert set(plan.sizes["planned"][("clean", "h100")]) == {(4, 6)}  # 4 of unbound, 6 at the peak
    planned = plan.evaluations["planned"].figures
    assert planned[("dirty", "h100")][0].demand_rps == pytest.approx(cap)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("cold_start_s", "kept"), [(120.0, False), (2 * 3600.0, True)],
                         ids=["a 2 min start is cheaper than an idle hour", "a 2 h start is dearer than an idle hour"])
def test_a_short_dip_keeps_replicas_warm_when_restarting_costs_more(cold_start_s: float, kept: bool) -> None:
    # One H100 replica idle for an hour: 75 W x 3600 s = 270 kJ. A start at 30 % of 700 W:
    # 25.2 kJ in 2 min, 1.5 MJ in 2 h.
    dirty = region("dirty", PARIS, gpus=8)
    a = assumptions(rate=1.0, cold_start_s=cold_start_s)
    demand = build_demand(even_trace(), a, DAY)
    option = pool_options([dirty], default_policy(), a, demand, client_groups(clients(("paris", PARIS, None)), 0.0),
                          ENERGY)[0]
    low = np.asarray([3, 1, 3, 3])
    keep_warm(low, option, [300.0] * 4, 3000 / 1e6, a)
    assert low.tolist() == ([3, 3, 3, 3] if kept else [3, 1, 3, 3])


@pytest.mark.timeout(60)
def test_a_day_with_quiet_hours_scales_down_and_counts_its_cold_starts() -> None:
    dirty = region("dirty", PARIS, gpus=8)
    probe = assumptions(rate=1.0)
    cap = capacity(default_policy(), build_demand(even_trace(), probe, DAY), probe, dirty)
    # Busy (3 replicas' worth) from 08:00 to 20:00 UTC, a tenth of one replica otherwise.
    profile = tuple(3.0 if 8 <= h < 20 else 0.1 for h in range(24))
    a = assumptions(rate=cap, hourly_profile=profile)
    plan = run([dirty], default_policy(), a, clients(("paris", PARIS, None)), {"dirty": 300.0})
    low = [s[0] for s in plan.sizes["planned"][("dirty", "h100")]]
    assert low == [1] * 8 + [3] * 12 + [1] * 4
    assert plan.evaluations["planned"].totals.cold_starts == 2  # at 08:00; the day repeats, so none at 00:00
    assert plan.evaluations["flat"].totals.cold_starts == 0
    assert math.isclose(plan.evaluations["planned"].totals.warm_gpu_hours, sum(low))
