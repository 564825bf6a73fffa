"""The power-cap model (``scheduler.energy.power_cap``): what a cap does to step costs, the
efficient cap, the knee against published points the fit never used, and the snapshot's
predictions under a pool's cap (config in the snapshot: decisions stay pure)."""

from __future__ import annotations

import itertools
import statistics

import numpy as np
import pytest
import yaml

from scheduler.energy import power_cap as pc
from scheduler.energy.derive import load_fit
from scheduler.energy.fit import point_costs
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.energy.published import POINTS_FILE, load_points, predicted_j_per_token, predicted_tokens_per_s
from scheduler.energy.step import RatedCosts, predict
from scheduler.types import PoolLiveState

MODEL = ProfileEnergyModel()
H100 = GPU_CATALOGUE["H100-80GB"]
CASES = [
    ("llama-3.1-8b", "H100-80GB", "bf16", 1),
    ("llama-3.1-70b", "H100-80GB", "fp8", 2),
    ("llama-3.1-8b", "A100-80GB", "bf16", 1),
    ("llama-3.1-70b", "H200-141GB", "bf16", 2),
    ("qwen3-32b", "H200-141GB", "bf16", 1),
    ("llama-3.2-1b", "L4", "bf16", 1),
    ("llama-3.1-8b", "B200", "bf16", 1),
]


def rated(model: str, gpu: str, precision: str, tp: int) -> RatedCosts:
    return MODEL.rated_costs(MODEL_CATALOGUE[model], GPU_CATALOGUE[gpu], precision, tp)


def test_no_cap_or_a_cap_at_tdp_changes_nothing() -> None:
    assert pc.power_cap(H100, None) is None
    assert pc.power_cap(H100, 700.0) is None
    r = rated("llama-3.1-8b", "H100-80GB", "bf16", 1)
    assert pc.capped(r, None, 64, 1000) is r
    with pytest.raises(ValueError):
        pc.power_cap(H100, 0.0)


@pytest.mark.parametrize("case", CASES)
def test_a_cap_above_the_draw_is_not_binding(case: tuple[str, str, str, int]) -> None:
    r = rated(*case)
    gpu = GPU_CATALOGUE[case[1]]
    probe = pc.power_cap(gpu, 1.0, case[3])
    assert probe is not None
    draw = pc.throttle(r.costs, probe, 8, 500).draw_w  # the knee at this operating point
    assert 0 < draw <= gpu.tdp_w
    above = pc.power_cap(gpu, min(draw + 1.0, gpu.tdp_w - 1e-6), case[3])
    assert above is not None and above.cap_w >= draw
    assert not pc.throttle(r.costs, above, 8, 500).binding
    assert pc.capped(r, above, 8, 500) is r


@pytest.mark.parametrize("case", CASES)
def test_below_the_knee_the_board_draws_the_cap_and_only_compute_slows(case: tuple[str, str, str, int]) -> None:
    r = rated(*case)
    gpu = GPU_CATALOGUE[case[1]]
    cap = pc.power_cap(gpu, 0.6 * gpu.tdp_w, case[3])
    assert cap is not None
    t = pc.throttle(r.costs, cap, 64, 1200)
    assert t.draw_w > cap.cap_w and t.binding and not t.below_range
    assert t.power_w == pytest.approx(cap.cap_w, rel=1e-6)
    step, token, kv, pair = t.time_factors
    assert step == kv == 1.0 and token == pair == pytest.approx(1.0 / t.clock)
    assert all(e > 0 for e in t.energy_factors)


@pytest.mark.parametrize("case", CASES)
def test_the_clock_falls_with_the_cap(case: tuple[str, str, str, int]) -> None:
    """The bisection for the clock needs the step's average draw monotone in the clock."""
    r = rated(*case)
    gpu = GPU_CATALOGUE[case[1]]
    clocks = []
    for share in np.linspace(0.95, 0.2, 40):
        cap = pc.power_cap(gpu, share * gpu.tdp_w, case[3])
        assert cap is not None
        clocks.append(pc.throttle(r.costs, cap, 64, 1200).clock)
    assert all(a >= b for a, b in itertools.pairwise(clocks))


@pytest.mark.parametrize("case", CASES)
def test_slower_and_cheaper_below_the_knee_down_to_the_efficient_cap(case: tuple[str, str, str, int]) -> None:
    r = rated(*case)
    gpu = GPU_CATALOGUE[case[1]]
    eco = pc.efficient_cap(gpu, [(MODEL_CATALOGUE[case[0]], case[2], case[3])], MODEL)
    base = pc.reference_point(r, None)
    previous = base
    cap_w = gpu.tdp_w - pc.ECO_STEP_W
    while cap_w >= eco.cap_w:
        point = pc.reference_point(r, pc.power_cap(gpu, cap_w, case[3]))
        assert point.tpot_s >= previous.tpot_s * (1 - 1e-9)  # never faster under a lower cap
        assert point.j_per_token <= previous.j_per_token * (1 + 1e-9)  # and never dearer, down to eco
        previous = point
        cap_w -= pc.ECO_STEP_W
    at_eco = pc.reference_point(r, pc.power_cap(gpu, eco.cap_w, case[3]))
    assert at_eco.j_per_token < base.j_per_token and at_eco.tpot_s > base.tpot_s
    # Below the voltage floor the clock falls faster than the power: dearer again (the U).
    lowest = pc.reference_point(r, pc.power_cap(gpu, pc.ECO_SEARCH_FROM * gpu.tdp_w, case[3]))
    assert lowest.j_per_token > at_eco.j_per_token and lowest.tpot_s > at_eco.tpot_s


@pytest.mark.parametrize("gpu", ["A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200"])
def test_the_efficient_cap_of_the_data_centre_gpus(gpu: str) -> None:
    spec = GPU_CATALOGUE[gpu]
    llama = MODEL_CATALOGUE["llama-3.1-8b"]
    eco = pc.efficient_cap(spec, [(llama, "bf16", 1)], MODEL)
    assert pc.ECO_SEARCH_FROM * spec.tdp_w < eco.cap_w < spec.tdp_w
    # Where the model puts it (docs/power-caps.md): about half of TDP, at the voltage floor,
    # for a fifth to a quarter fewer joules per token and a few per cent longer TPOT.
    assert 0.4 <= eco.share <= 0.6
    assert 0.7 <= eco.j_per_token_ratio <= 0.85 and 1.0 < eco.tpot_ratio <= 1.15
    # The highest cap within the tolerance of the minimum.
    costs = MODEL.rated_costs(llama, spec, "bf16", 1)
    above = pc.reference_point(costs, pc.power_cap(spec, eco.cap_w + pc.ECO_STEP_W, 1))
    base = pc.reference_point(costs, None)
    assert above.j_per_token / base.j_per_token > eco.j_per_token_ratio


def test_a_profile_drawing_more_than_tdp_is_held_at_tdp() -> None:
    r = rated("llama-3.1-8b", "H100-80GB", "bf16", 1)
    cap = pc.power_cap(H100, 690.0)
    assert cap is not None
    # A prefill-sized batch: the fitted compute share is above 1 x TDP.
    t = pc.throttle(r.costs, cap, 256, 8)
    assert t.draw_w <= H100.tdp_w


def test_the_knee_against_published_points_the_fit_never_used() -> None:
    """A cap binds only above the replica's draw at its default limit: the knee is where the
    model puts that draw. Against the measured average power of the held-out ML.ENERGY points
    (points.yaml role held_out: never fitted), per GPU."""
    raw = {p["id"]: p for p in yaml.safe_load(POINTS_FILE.read_text())["points"]}
    fit = load_fit()
    errors = []
    for point in load_points().role("held_out"):
        costs = point_costs(point, fit.assumptions)
        model_w = predicted_j_per_token(costs, point) * predicted_tokens_per_s(costs, point)
        errors.append(model_w / raw[point.id]["power_w"] - 1.0)
    assert len(errors) >= 60
    within = sum(abs(e) <= 0.2 for e in errors) / len(errors)
    assert within >= 0.9, f"only {within:.0%} of held-out draws within 20 %"
    assert abs(statistics.median(errors)) < 0.05


def test_capped_predictions_through_predict() -> None:
    r = rated("llama-3.1-70b", "H200-141GB", "bf16", 2)
    gpu = GPU_CATALOGUE["H200-141GB"]
    cap = pc.power_cap(gpu, 400.0, 2)
    e0, l0 = predict(r, 128, 2000)
    e1, l1 = predict(pc.capped(r, cap, 128, 2000), 128, 2000)
    assert e1.joules(1024, 0, 256) < e0.joules(1024, 0, 256)
    assert l1.tpot_s > l0.tpot_s and l1.prefill_s_per_token > l0.prefill_s_per_token
    assert l1.tpot_s_per_context_token == pytest.approx(l0.tpot_s_per_context_token, rel=0.05)


def eco_snapshot(eco: bool, cap_w: float | None = None, running: int = 64):  # type: ignore[no-untyped-def]
    from scheduler import testing

    pool = testing.pool("h100-chat", "H100-80GB", count=8)
    if cap_w is not None:
        pool = pool.model_copy(update={"power_cap_w": cap_w})
    literal = testing.region("us-east", pools=[pool])
    literal = testing.RegionLiteral(literal.config.model_copy(update={"eco": eco}), literal.carbon,
                                    literal.carbon_age_s)
    live = {"us-east": testing.live_state("us-east", testing.T0, {
        "h100-chat": PoolLiveState(running=running * 8, kv_cache_usage=0.3)})}
    return testing.snapshot(literal, live=live)


def test_the_snapshot_predicts_under_the_pools_cap() -> None:
    """The cap is config in the snapshot (power_cap_w, the region's eco switch): the perf the
    decision reads is slower and cheaper per token under it, and the same for the same inputs."""
    default, eco, capped = eco_snapshot(False), eco_snapshot(True), eco_snapshot(False, cap_w=400.0)
    (d,), (e,), (c,) = default.perf, eco.perf, capped.perf
    for perf in (e, c):
        assert perf.energy.joules(1024, 0, 256) < d.energy.joules(1024, 0, 256)
        assert perf.latency.tpot_s > d.latency.tpot_s
    assert eco.perf == eco_snapshot(True).perf
    assert eco.regions[0].eco and not default.regions[0].eco


def test_decisions_stay_a_pure_function_of_request_and_snapshot() -> None:
    from scheduler import testing

    snapshot = eco_snapshot(True)
    request = testing.request(prompt_tokens=800, max_tokens=200)
    first = testing.scheduler(0).schedule(request, snapshot)
    again = testing.scheduler(0).schedule(request, snapshot)
    assert list(first.survivor_index) == list(again.survivor_index) and list(first.order) == list(again.order)
    assert list(first.totals) == list(again.totals)
    assert np.array_equal(np.asarray(first.quantities), np.asarray(again.quantities))
    # ... and what it ranked by is the capped prediction: less carbon, a longer TTFT.
    plain = testing.scheduler(0).schedule(request, eco_snapshot(False))

    def quantity(decision, scorer: str) -> float:  # type: ignore[no-untyped-def]
        return float(np.asarray(decision.quantities)[decision.scorer_names.index(scorer)][0])

    assert quantity(first, "carbon-scorer") < quantity(plain, "carbon-scorer")
    assert quantity(first, "ttft-scorer") > quantity(plain, "ttft-scorer")
