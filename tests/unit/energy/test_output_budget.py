"""Output budgets: the max_tokens with the most quality per joule, checked by hand on one table
and against an independent brute force (every integer max_tokens) on drawn tables and energies."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from scheduler.config.schema import OutputBudgetConfig
from scheduler.energy.output_budget import best_budget, quality_at

TABLE = ((64, 0.40), (128, 0.70), (256, 0.90), (512, 0.95))


def linear(prefill_j: float, per_token_j: float):  # type: ignore[no-untyped-def]
    return lambda n: prefill_j + per_token_j * n


def test_the_budget_sits_where_quality_stops_rising_faster_than_energy() -> None:
    # 100 J of prefill, 1 J per token: q/E = 0.40/164, 0.70/228, 0.90/356, 0.95/612 -> 128 wins.
    budget = best_budget(TABLE, 512, linear(100.0, 1.0), "suggest")
    assert (budget.max_tokens, budget.quality, budget.energy_j) == (128, 0.70, 228.0)
    assert (budget.requested_max_tokens, budget.quality_requested, budget.energy_j_requested) == (512, 0.95, 612.0)
    assert not budget.enforced and budget.quality_per_kj == pytest.approx(0.70 / 228 * 1000)
    # Prefill dominating: the fixed cost makes longer answers cheap per unit of quality.
    assert best_budget(TABLE, 512, linear(10_000.0, 1.0), "enforce").max_tokens == 512


def test_a_budget_never_raises_max_tokens_and_is_enforced_only_below_the_request() -> None:
    small = best_budget(TABLE, 100, linear(100.0, 1.0), "enforce")
    assert small.max_tokens <= 100
    assert small.quality_requested == pytest.approx(0.40 + 0.30 * (100 - 64) / 64)
    same = best_budget(TABLE, 128, linear(100.0, 1.0), "enforce")
    assert same.max_tokens == 128 and not same.enforced
    assert best_budget(TABLE, 512, linear(100.0, 1.0), "enforce").enforced


def test_quality_is_linear_between_points_and_flat_past_the_last() -> None:
    assert quality_at(TABLE, 32) == pytest.approx(0.20)
    assert quality_at(TABLE, 192) == pytest.approx(0.80)
    assert quality_at(TABLE, 4096) == 0.95


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(st.tuples(st.integers(1, 300), st.floats(0, 0.3)), min_size=2, max_size=6),
    requested=st.integers(1, 2000),
    prefill=st.floats(0.1, 5000),
    per_token=st.floats(0.01, 20),
)
def test_no_level_the_table_allows_has_more_quality_per_joule(steps, requested, prefill, per_token) -> None:  # type: ignore[no-untyped-def]
    points, tokens, quality = [], 0, 0.0
    for dt, dq in steps:
        tokens, quality = tokens + dt, min(1.0, quality + dq)
        points.append((tokens, quality))
    energy = linear(prefill, per_token)
    budget = best_budget(points, requested, energy, "suggest")
    assert 1 <= budget.max_tokens <= requested
    ratio = budget.quality / budget.energy_j
    # Brute force over every max_tokens up to the request: a table level or the request itself
    # is always as good as any point in between (q is linear there, E affine).
    best = max(quality_at(points, n) / energy(n) for n in range(1, requested + 1))
    assert ratio >= best * (1 - 1e-9)


def test_a_table_whose_quality_falls_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="quality must not fall"):
        OutputBudgetConfig.model_validate({"mode": "suggest", "tables": [
            {"model": "llama-3.1-8b", "task_class": "summarize",
             "quality": [{"max_tokens": 64, "quality": 0.6}, {"max_tokens": 128, "quality": 0.5}]}]})
    with pytest.raises(ValidationError, match="two tables"):
        table = {"model": "llama-3.1-8b", "task_class": "summarize",
                 "quality": [{"max_tokens": 64, "quality": 0.5}, {"max_tokens": 128, "quality": 0.6}]}
        OutputBudgetConfig.model_validate({"mode": "enforce", "tables": [table, table]})
