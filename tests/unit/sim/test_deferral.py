"""The simulator's deferral queue (scheduler.sim.deferral) on fleets whose outcome follows by hand.

The zone SWING is dirty (400 g/kWh) for three hours from START, clean (50 g/kWh) for the next
three, then dirty again: a deferrable request arriving in the first hour with a 6 h deadline
belongs in hour 3.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.sim.deferral import Deferral, merge
from scheduler.sim.engine import RegionOutage
from tests.unit.sim.kit import OSLO, PARIS, START, Files, policy, region, simulate, write_zone

T0 = START.timestamp()
H = 3600.0
PUE = 1.2
EXACT = Deferral(forecast_error=0.0)


@pytest.fixture
def swing(files: Files) -> Files:
    write_zone(files.carbon_dir, "SWING", [400.0] * 3 + [50.0] * 3 + [400.0] * 42)
    return files


def both(files: Files, regions: tuple[Any, ...], deferral: Deferral = EXACT, **kw: Any) -> dict[str, Any]:
    """The queue's figures beside the same workload decided at arrival, as run_policy merges them."""
    queued, _ = simulate(files, regions, policy(), deferral=deferral, **kw)
    at_arrival, _ = simulate(files, regions, policy(), deferral=None, **kw)
    assert queued.deferral["deferral"] == "queue" and at_arrival.deferral["deferral"] == "at-arrival"
    return merge(queued.deferral, at_arrival.deferral)


def test_deferrable_requests_wait_for_the_clean_hours_and_meet_their_deadline(swing: Files) -> None:
    only = (region("only", "SWING", OSLO),)
    d = both(swing, only, hours=1.0, rate=1.0, deferrable_share=0.5, deferrable_deadline_s=6 * H)
    n = d["deferrable_requests"]
    assert 1500 < n < 2100
    # Perfect foresight: every one is held for hour 3 and runs on the clean grid.
    assert d["deferred_release_reasons"] == {"window": n, "now": 0, "deadline": 0, "no-forecast": 0}
    assert d["deferred_held"] == d["deferred_ran"] == n
    assert d["deferred_g_per_kwh"] == pytest.approx(50.0 * PUE)
    assert d["deferred_g_per_kwh_at_arrival"] == pytest.approx(400.0 * PUE)
    assert d["missed_deadlines"] == d["missed_deadlines_at_arrival"] == 0
    assert 2 * H <= d["deferred_wait_p50_s"] <= d["deferred_wait_max_s"] <= 3 * H
    # Released together at 03:00 they share batches: fewer joules each than one by one.
    assert d["deferred_largest_release"] == n
    assert d["deferred_j_per_request"] < d["deferred_j_per_request_at_arrival"]
    assert d["deferred_gco2e_change"] < -0.875  # 50/400 of the grams, and fewer joules
    assert d["deferred_slack_min_s"] > H


def test_a_request_that_would_miss_its_deadline_is_released_at_once(swing: Files) -> None:
    # 5 min is less than the 5 min guard plus twice the predicted completion: no window fits.
    only = (region("only", "SWING", OSLO),)
    d = both(swing, only, hours=0.25, rate=1.0, deferrable_share=0.5, deferrable_deadline_s=300.0)
    n = d["deferrable_requests"]
    assert d["deferred_release_reasons"]["deadline"] == n > 0
    assert d["deferred_held"] == 0
    assert d["deferred_g_per_kwh"] == pytest.approx(400.0 * PUE)
    assert d["deferred_gco2e_per_request"] == pytest.approx(d["deferred_gco2e_per_request_at_arrival"])
    assert d["missed_deadlines"] == 0
    assert d["deferred_wait_max_s"] == 0.0
    assert d["deferred_largest_release"] == 0


def test_a_deadline_before_the_clean_hours_keeps_them_out_of_reach(swing: Files) -> None:
    only = (region("only", "SWING", OSLO),)
    d = both(swing, only, hours=0.25, rate=1.0, deferrable_share=0.5, deferrable_deadline_s=2 * H)
    assert d["deferred_held"] == 0  # flat 400 until the deadline: now is as good as any
    assert d["deferred_release_reasons"]["now"] == d["deferrable_requests"]


def test_a_region_down_at_the_release_loses_no_held_request(swing: Files) -> None:
    # Both regions on SWING; the one the policy ranks first at arrival is down from just
    # before the release until after it: the held requests run in the other.
    regions = (region("paris", "SWING", PARIS), region("oslo", "SWING", OSLO))
    first, _ = simulate(swing, regions, policy(), hours=0.05, rate=1.0)
    ranked_first = max(first.region_share, key=lambda name: first.region_share[name])
    outage = RegionOutage(ranked_first, T0 + 3 * H - 60.0, T0 + 5 * H)
    queued, _ = simulate(swing, regions, policy(), hours=0.5, rate=1.0, deferrable_share=0.5,
                         deferrable_deadline_s=6 * H, deferral=EXACT, region_outages=(outage,))
    d = queued.deferral
    assert d["deferred_held"] == d["deferred_ran"] == d["deferrable_requests"] > 0
    assert d["missed_deadlines"] == 0
    assert queued.failed == 0 and queued.unschedulable == 0


def test_without_deferrable_requests_the_queue_changes_nothing(swing: Files) -> None:
    only = (region("only", "SWING", OSLO), region("paris", "DIRTY", PARIS))

    def run(deferral: Deferral | None) -> dict[str, Any]:
        result, _ = simulate(swing, only, policy(), hours=0.1, rate=2.0, deferral=deferral)
        out = result.to_json()
        del out["timings_s"]
        return out

    with_queue = run(EXACT)
    assert with_queue == run(None)
    assert "deferred_gco2e_per_request" not in with_queue


def test_the_forecast_error_is_seeded(swing: Files) -> None:
    only = (region("only", "SWING", OSLO),)
    noisy = Deferral(forecast_error=0.5)

    def run(seed: int) -> dict[str, Any]:
        result, _ = simulate(swing, only, policy(), hours=0.25, rate=1.0, deferrable_share=0.5,
                             deferrable_deadline_s=6 * H, deferral=noisy, seed=seed)
        return dict(result.deferral)

    assert run(3) == run(3)
    assert run(3) != run(4)


def test_on_a_shipped_grid_with_a_noisy_forecast_the_work_runs_cleaner(files: Files) -> None:
    # Spain on 2023-06-01 from 00:00 UTC: ~280 g/kWh at night, ~160-180 under the midday sun
    # (hours 8-14). With a 12 h deadline a noisy forecast (sigma 0.15) still finds those hours.
    shipped = dataclasses.replace(files, carbon_dir=SHIPPED_CARBON_DIR)
    spain = (region("spain", "ES", (40.42, -3.70)),)
    d = both(shipped, spain, deferral=Deferral(forecast_error=0.15), hours=0.5, rate=0.5, deferrable_share=1.0,
             deferrable_deadline_s=12 * H)
    assert d["missed_deadlines"] == 0
    assert d["deferred_held"] == d["deferrable_requests"] == 900
    assert d["deferred_g_per_kwh"] < 0.7 * d["deferred_g_per_kwh_at_arrival"]
