"""The rollback rule over each arm's figures (scheduler.canary.stats)."""

from __future__ import annotations

from scheduler.canary.stats import ArmFigures, Outcome, describe, hash_field, judge
from scheduler.config.schema import CanaryRollback

RULE = CanaryRollback.model_validate({
    "window": "30s", "min_requests": 20,
    "ttft_slo_attainment": {"min": 0.9, "max_drop": 0.05},
    "error_rate": {"max": 0.1, "max_rise": 0.02},
    "retry_rate": {"max": 0.2},
    "energy_j_per_request": {"max_ratio": 1.5},
    "gco2e_per_request": {"max": 5.0, "max_ratio": 2.0},
})


def _arm(requests: int, ttft_ok: int | None = None, errors: int = 0, retried: int = 0, energy_j: float = 100.0,
         carbon_g: float = 1.0) -> ArmFigures:
    ok = requests if ttft_ok is None else ttft_ok
    return ArmFigures(requests=requests, ttft_n=requests, ttft_ok=ok, errors=errors, retried=retried,
                      energy_n=requests, energy_j=energy_j * requests, carbon_n=requests, carbon_g=carbon_g * requests)


def test_nothing_is_judged_below_min_requests() -> None:
    assert judge(RULE, _arm(100), _arm(19, ttft_ok=0, errors=19)) is None


def test_a_healthy_canary_stays() -> None:
    assert judge(RULE, _arm(100), _arm(40, ttft_ok=39)) is None


def test_the_attainment_floor() -> None:
    verdict = judge(RULE, _arm(5), _arm(40, ttft_ok=30))
    assert verdict is not None and verdict.metrics == ("ttft_slo_attainment",)
    assert "TTFT-SLO attainment 75.0 % is below the floor of 90.0 %" in verdict.reason
    assert verdict.reason.endswith("; canary 40 requests, control 5, over the last 30-60 s")


def test_the_drop_against_the_control_needs_the_control_to_have_min_requests() -> None:
    canary = _arm(40, ttft_ok=37)  # 92.5 %: above the floor
    assert judge(RULE, _arm(10), canary) is None  # control below min_requests: no relative bound
    verdict = judge(RULE, _arm(100), canary)
    assert verdict is not None and "7.5 points below the control's 100.0 % (at most 5.0 points)" in verdict.reason


def test_error_and_retry_rates() -> None:
    verdict = judge(RULE, _arm(100, errors=1), _arm(40, errors=2, retried=10))
    assert verdict is not None
    assert verdict.metrics == ("error_rate", "retry_rate")
    assert "error rate 5.0 % is 4.0 points above the control's 1.0 %" in verdict.reason
    assert "retry rate 25.0 % is above the ceiling of 20.0 %" in verdict.reason


def test_energy_and_carbon_per_request() -> None:
    verdict = judge(RULE, _arm(100, energy_j=100.0, carbon_g=2.0), _arm(40, energy_j=160.0, carbon_g=6.0))
    assert verdict is not None and verdict.metrics == ("energy_j_per_request", "gco2e_per_request")
    assert "energy per request 160 J is 1.60x the control's 100 J (at most 1.5x)" in verdict.reason
    assert "carbon per request 6 gCO2e is above the ceiling of 5 gCO2e" in verdict.reason


def test_figures_from_outcomes_through_the_hash() -> None:
    table: dict[str, float] = {}
    outcomes = [Outcome(True, False, False, 10.0, 0.1), Outcome(False, True, True), Outcome(None, False, False, 5.0)]
    for outcome in outcomes:
        for name, amount in outcome.amounts().items():
            table[hash_field("canary", name)] = table.get(hash_field("canary", name), 0.0) + amount
    figures = ArmFigures.from_hash({k: repr(v) for k, v in table.items()}, "canary")
    assert figures.requests == 3 and figures.ttft_n == 2
    assert figures.ttft_slo_attainment == 0.5 and figures.error_rate == 1 / 3 and figures.retry_rate == 1 / 3
    assert figures.energy_j_per_request == 7.5 and figures.gco2e_per_request == 0.1
    empty = ArmFigures.from_hash({}, "control")
    assert empty.requests == 0 and empty.ttft_slo_attainment is None and empty.energy_j_per_request is None


def test_the_rule_in_words() -> None:
    lines = describe(RULE)
    assert lines[0].startswith("judged over the current and the previous 30 s window, once the canary has 20")
    assert "TTFT-SLO attainment below 90.0 %" in lines
    assert "energy per request above 1.5x the control's" in lines
    assert len(lines) == 1 + 8  # one per bound
