"""Prefix and workflow affinity: the per-candidate prefill credit of the energy model where a
prefix is warm, and the affinity scorer's lost-cache joules (docs/affinity.md). The fleets,
prompts and rates here are not those the shipped rates were chosen on (docs/affinity.md)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pytest

from scheduler.framework.plugin import Abstain
from scheduler.framework.predict import request_view
from scheduler.framework.state import prepared, selected
from scheduler.plugins.filters.model_index import ModelIndex
from scheduler.plugins.scorers.affinity import AffinityScorer
from scheduler.types import FleetSnapshot, Request, WarmPrefix
from tests.literals import NOW, carbon, pool, region

REGIONS = [region("north", zone="N", pools=[pool("h200", "H200-141GB"), pool("a100", "A100-80GB")]),
           region("west", zone="W", pools=[pool("h100", "H100-80GB")])]
SIGNALS = [carbon("N", 40), carbon("W", 300)]


def req(prompt: int = 6000, out: int = 64, **overrides: object) -> Request:
    return Request(request_id="r-17", model="llama-3.1-8b", prompt_tokens=prompt, max_tokens=out,
                   **overrides)  # type: ignore[arg-type]


def with_warmth(snapshot: FleetSnapshot, warm: dict[str, tuple[WarmPrefix, ...]] | None = None,
                workflows: dict[str, WarmPrefix] | None = None) -> FleetSnapshot:
    return dataclasses.replace(snapshot, prefix_warm=warm or {}, workflows=workflows or {}, live_key=object())


def lost(snapshot: FleetSnapshot, request: Request) -> dict[str, float]:
    base, _ = selected(ModelIndex(), request, snapshot)
    view = request_view(request, snapshot, base)
    scorer = AffinityScorer()
    result = scorer.score(view, prepared(scorer, snapshot, base), slice(None))
    assert not isinstance(result, Abstain)
    return dict(zip((snapshot.candidates[i].key for i in base), np.asarray(result).tolist(), strict=True))


def energy(snapshot: FleetSnapshot, request: Request) -> dict[str, float]:
    base, _ = selected(ModelIndex(), request, snapshot)
    view = request_view(request, snapshot, base)
    return dict(zip((snapshot.candidates[i].key for i in base), view.energy_j.tolist(), strict=True))


def test_a_published_hit_credits_the_avoided_prefill_on_that_candidate_only(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(REGIONS, carbon_signals=SIGNALS)
    request = req(prefix_key="auto:abc", shared_prefix_tokens=4500)
    cold = energy(snapshot, request)
    warm = with_warmth(snapshot, {"auto:abc": (WarmPrefix("north", "a100", 4000, NOW - 5),)})
    credited = energy(warm, request)
    assert credited["north/h200"] == cold["north/h200"] and credited["west/h100"] == cold["west/h100"]
    candidate = next(c for c in snapshot.candidates if c.key == "north/a100")
    coefficients = snapshot.perf[candidate.index].energy
    assert cold["north/a100"] - credited["north/a100"] == pytest.approx(coefficients.avoided_j(6000, 4000), rel=1e-9)
    # A key the snapshot does not hold warm credits nothing.
    assert energy(warm, req(prefix_key="auto:other", shared_prefix_tokens=4500)) == cold


def test_a_hit_is_credited_only_up_to_the_prefix_the_request_shares(make_snapshot) -> None:  # type: ignore[no-untyped-def]
    """A chain cached 11,000 tokens under its system prompt's key: an unrelated request with the
    same system prompt shares only the key's head (the policy's prefix_key_tokens), a fan-out
    sibling what it declares, and the chain's next step its own last prompt on its pool."""
    snapshot = make_snapshot(REGIONS, carbon_signals=SIGNALS)
    hit = {"auto:sys": (WarmPrefix("north", "a100", 11000, NOW - 1),)}
    a100 = next(c for c in snapshot.candidates if c.key == "north/a100")
    coefficients = snapshot.perf[a100.index].energy
    head = snapshot.policy.prefix_key_tokens

    def credit(request: Request, workflows: dict[str, WarmPrefix] | None = None) -> float:
        cold = energy(with_warmth(snapshot, {}, workflows), request)["north/a100"]
        return cold - energy(with_warmth(snapshot, hit, workflows), request)["north/a100"]

    unrelated = req(prompt=12000, prefix_key="auto:sys")
    assert credit(unrelated) == pytest.approx(coefficients.avoided_j(12000, head), rel=1e-9)
    sibling = req(prompt=12000, prefix_key="auto:sys", workflow_id="f", workflow_shape="fanout",
                  shared_prefix_tokens=3000)
    assert credit(sibling) == pytest.approx(coefficients.avoided_j(12000, 3000), rel=1e-9)
    step = req(prompt=12000, prefix_key="auto:sys", workflow_id="c", workflow_shape="chain")
    home = {"c": WarmPrefix("north", "a100", 11000, NOW - 1, source="workflow")}
    assert credit(step) == pytest.approx(coefficients.avoided_j(12000, head), rel=1e-9)  # another chain's hit
    cold = energy(snapshot, step)["north/a100"]
    assert cold - energy(with_warmth(snapshot, {}, home), step)["north/a100"] == pytest.approx(
        coefficients.avoided_j(12000, 11000), rel=1e-9)  # its own history


def test_the_credit_moves_the_choice_and_the_decision_predicts_the_warm_energy(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = make_snapshot(REGIONS, carbon_signals=SIGNALS)
    # Prefill-heavy: 12k prompt tokens, 2 output tokens.
    request = req(prompt=12000, out=2, prefix_key="auto:sys", shared_prefix_tokens=11000)
    cold = scheduler.schedule(request, snapshot)
    assert cold.ranked_candidates[0].key == "north/h200"
    warm = with_warmth(snapshot, {"auto:sys": (WarmPrefix("north", "a100", 11000, NOW - 1),)})
    decision = scheduler.schedule(request, warm)
    assert decision.ranked_candidates[0].key == "north/a100"
    assert decision.energy_inputs is not None and decision.energy_inputs[2] == 11000
    print(f"\ncold: {cold.ranked_candidates[0].key} {cold.energy.energy_j:.1f} J; "
          f"warm: {decision.ranked_candidates[0].key} {decision.energy.energy_j:.1f} J")


@dataclass
class Case:
    name: str
    request: Request
    workflows: dict[str, WarmPrefix]
    warm: dict[str, tuple[WarmPrefix, ...]]
    zero: set[str]  # candidates that lose nothing
    expect_j: dict[str, tuple[int, int]]  # candidate -> (W, w0) of avoided_j(C, W) - avoided_j(C, w0)


HOME = WarmPrefix("west", "h100", 5000, NOW - 10, source="workflow")
CASES = [
    Case("no workflow id: nothing is lost anywhere", req(prefix_key="k"), {"wf": HOME}, {},
         zero={"north/h200", "north/a100", "west/h100"}, expect_j={}),
    Case("home unconfirmed: leaving costs rebuilding its 5000 tokens", req(prefix_key="k", workflow_id="wf"),
         {"wf": HOME}, {}, zero={"west/h100"}, expect_j={"north/h200": (5000, 0), "north/a100": (5000, 0)}),
    Case("home published warm for all of it: the energy model carries it, nothing added",
         req(prefix_key="k", workflow_id="wf"), {"wf": HOME}, {"k": (WarmPrefix("west", "h100", 5200, NOW),)},
         zero={"north/h200", "north/a100", "west/h100"}, expect_j={}),
    Case("home published warm for part: only the rest", req(prefix_key="k", workflow_id="wf"), {"wf": HOME},
         {"k": (WarmPrefix("west", "h100", 2048, NOW),)}, zero={"west/h100"},
         expect_j={"north/h200": (5000, 2048), "north/a100": (5000, 2048)}),
    Case("a shorter prompt than the home's: only what it shares", req(prompt=3000, workflow_id="wf"),
         {"wf": HOME}, {}, zero={"west/h100"}, expect_j={"north/h200": (3000, 0), "north/a100": (3000, 0)}),
    Case("another workflow's home does not count", req(workflow_id="wf-2"), {"wf": HOME}, {},
         zero={"north/h200", "north/a100", "west/h100"}, expect_j={}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_lost_cache(case: Case, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    snapshot = with_warmth(make_snapshot(REGIONS, carbon_signals=SIGNALS), case.warm, case.workflows)
    result = lost(snapshot, case.request)
    assert {k for k, v in result.items() if v == 0.0} == case.zero
    by_key = {c.key: c for c in snapshot.candidates}
    prompt = case.request.prompt_tokens
    for key, (w, w0) in case.expect_j.items():
        e = snapshot.perf[by_key[key].index].energy
        assert result[key] == pytest.approx(e.avoided_j(prompt, w) - e.avoided_j(prompt, w0), rel=1e-9)
        assert result[key] > 0
    # A quantity, not a rank: the same for each candidate whoever else is listed.
    for key, value in result.items():
        region_name = key.split("/")[0]
        alone = with_warmth(make_snapshot([r for r in REGIONS if r.name == region_name], carbon_signals=SIGNALS),
                            case.warm, case.workflows)
        assert lost(alone, case.request)[key] == pytest.approx(value, rel=1e-12)


def test_the_workflow_stays_unless_moving_saves_more_than_the_lost_cache(scheduler, make_snapshot) -> None:  # type: ignore[no-untyped-def]
    """Both grids alike: a cold agent step goes to north's H200 (less energy, less carbon).
    Homed on west's H100 with its long context warm, it stays (what north saves is less than
    rebuilding the cache costs); homed there with a short one, it moves. With west's grid 7.5x
    dirtier, the carbon north saves outweighs even the long context at the default's floor
    rate (docs/affinity.md: the rate prices the lost joules at the fleet's cheapest)."""
    alike = make_snapshot(REGIONS, carbon_signals=[carbon("N", 40), carbon("W", 40)])
    step = req(prompt=30000, out=8, workflow_id="agent-1")
    assert scheduler.schedule(step, alike).ranked_candidates[0].key == "north/h200"
    long_home = {"agent-1": dataclasses.replace(HOME, cached_tokens=30000)}
    short_home = {"agent-1": dataclasses.replace(HOME, cached_tokens=200)}
    stay = scheduler.schedule(step, with_warmth(alike, workflows=long_home))
    assert stay.ranked_candidates[0].key == "west/h100"
    assert scheduler.schedule(step, with_warmth(alike, workflows=short_home)).ranked_candidates[0].key == "north/h200"
    dirty_west = make_snapshot(REGIONS, carbon_signals=SIGNALS)
    moved = scheduler.schedule(step, with_warmth(dirty_west, workflows=long_home))
    assert moved.ranked_candidates[0].region.name == "north"
    costs = {s.candidate.key: s.costs for s in stay.ranked}
    print(f"\nalike grids, 30000 warm tokens in west: stays in {stay.ranked_candidates[0].key}; lost-cache cost "
          f"of north/h200 {costs['north/h200']['affinity-scorer']:.3g} USD; dirty west: moves to "
          f"{moved.ranked_candidates[0].key}")
