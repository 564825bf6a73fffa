"""The iteration-level replica: small cases worked out by hand, and the fast replica (closed-form
decode runs) against the step-by-step reference on random workloads."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.energy.step import StepCosts
from scheduler.sim.reference import reference_replay
from scheduler.sim.replica import TIE_S, KvKnee, Replica, Seq, replay

# Round numbers: a step costs 10 ms + 1 ms a token + 0.1 ms a KV token read + 0.01 ms a pair,
# and 10 J + 1 J a token + 0.1 J a KV token + 0.01 J a pair.
COSTS = StepCosts(t_step=0.01, t_token=0.001, t_kv=1e-4, t_pair=1e-5, e_step=10.0, e_token=1.0, e_kv=0.1,
                  e_pair=0.01, idle_w=50.0, max_num_seqs=2, max_batched_tokens=8, kv_capacity_tokens=100)


def seqs(*specs: tuple[float, int, int]) -> list[Seq]:
    return [Seq(arrived, prompt, output) for arrived, prompt, output in specs]


def test_one_request_alone_prefills_in_one_step_then_decodes_one_token_a_step() -> None:
    (a,) = run = seqs((0.0, 4, 3))
    replica = replay(COSTS, run)
    prefill = COSTS.step_time(4, 0, 10)  # 4 tokens, pairs 4 x 5 / 2
    assert prefill == pytest.approx(0.0141)
    decode = COSTS.step_time(1, 5, 5) + COSTS.step_time(1, 6, 6)  # contexts prompt + 1, prompt + 2
    assert a.admitted == 0.0
    assert a.first_token == pytest.approx(prefill)
    assert a.done == pytest.approx(prefill + decode)
    # Alone, it pays every step in full: 14.1 + 11.55 + 11.66 J.
    assert a.energy_j == pytest.approx(37.31)
    assert replica.busy_s == pytest.approx(a.done)


def test_a_prompt_longer_than_the_token_budget_is_prefilled_in_chunks() -> None:
    (a,) = run = seqs((0.0, 12, 1))
    replay(COSTS, run)
    first = COSTS.step_time(8, 0, 36)
    second = COSTS.step_time(4, 8, 4 * 8 + 10)  # reads the 8 tokens before it
    assert a.first_token == a.done == pytest.approx(first + second)


def test_sequences_in_one_step_split_its_fixed_energy() -> None:
    a, b = run = seqs((0.0, 4, 2), (0.0, 2, 2))
    replica = replay(COSTS, run)
    # Step 1 prefills both (6 tokens), step 2 decodes both (contexts 5 and 3).
    assert a.first_token == b.first_token == pytest.approx(COSTS.step_time(6, 0, 13))
    assert a.done == b.done == pytest.approx(COSTS.step_time(6, 0, 13) + COSTS.step_time(2, 8, 8))
    assert a.energy_j == pytest.approx(5 + 4 + 0.1 + 5 + 1 + 0.5 + 0.05)
    assert b.energy_j == pytest.approx(5 + 2 + 0.03 + 5 + 1 + 0.3 + 0.03)
    assert a.energy_j + b.energy_j == pytest.approx(replica.energy_j)


def test_past_max_num_seqs_a_request_waits_for_a_running_one_to_finish() -> None:
    a, b, c = run = seqs((0.0, 2, 3), (0.0, 2, 3), (0.0, 2, 3))
    replay(COSTS, run)
    both_done = COSTS.step_time(4, 0, 6) + COSTS.step_time(2, 6, 6) + COSTS.step_time(2, 8, 8)
    assert a.done == b.done == pytest.approx(both_done)
    assert c.admitted == pytest.approx(both_done)
    assert c.first_token == pytest.approx(both_done + COSTS.step_time(2, 0, 3))


def test_kv_is_reserved_for_prompt_and_output_and_nothing_overtakes_the_queue_head() -> None:
    costs = StepCosts(**{**COSTS.as_dict(), "max_num_seqs": 4, "max_batched_tokens": 8, "kv_capacity_tokens": 100})
    a, b, c = run = seqs((0.0, 50, 40), (0.001, 5, 6), (0.002, 1, 1))
    replay(costs, run)
    # a reserves 90 tokens; b's 11 do not fit beside it, and c (2 tokens, would fit) waits behind b.
    assert b.admitted == pytest.approx(a.done)
    assert c.admitted == pytest.approx(a.done)


def test_a_prefix_cache_hit_skips_the_cached_tokens_prefill() -> None:
    first, second = run = [Seq(0.0, 4, 1, "system", 3), Seq(1.0, 4, 1, "system", 3)]
    replay(COSTS, run)
    assert (first.cached, second.cached) == (0, 3)
    # One token computed, reading the 3 cached ones: 10 + 1 + 0.3 + 0.04 ms.
    assert second.first_token - second.admitted == pytest.approx(0.01134)


def test_an_arrival_during_a_decode_run_joins_at_the_next_step_boundary() -> None:
    run = seqs((0.0, 2, 10), (0.05, 2, 1))
    replay(COSTS, run)
    b = run[1]
    boundaries = [COSTS.step_time(2, 0, 3)]
    for k in range(1, 9):
        boundaries.append(boundaries[-1] + COSTS.step_time(1, 2 + k, 2 + k))
    assert b.admitted == pytest.approx(min(t for t in boundaries if t >= 0.05))


def test_a_request_larger_than_the_whole_cache_runs_alone() -> None:
    costs = StepCosts(**{**COSTS.as_dict(), "max_num_seqs": 4, "kv_capacity_tokens": 10})
    a, b = run = seqs((0.0, 20, 2), (0.0, 1, 1))
    replay(costs, run)
    assert a.done > 0 and b.admitted == pytest.approx(a.done)


def test_the_token_budget_may_not_be_below_max_num_seqs() -> None:
    with pytest.raises(ValueError, match="max_batched_tokens"):
        replay(StepCosts(**{**COSTS.as_dict(), "max_num_seqs": 16, "max_batched_tokens": 8}), [])


def test_an_arrival_exactly_on_a_decode_step_boundary_joins_that_step() -> None:
    # Steps of exactly 1 ms; b arrives 13 ms after a, as a's prefill step (1 ms) and 12 of its 13
    # decode steps end, on the 1 ms grid (207 x 0.001 s; the replicas reach that boundary by
    # 194 x 0.001 + T(12) and by a running sum, three floats that need not be equal). b joins
    # the step that starts then and shares it with a. Deciding the cut on T(k) >= arrival - run
    # start once put b one step later (a 14.0 J, b 1.0 J); the step-by-step reference, summing,
    # could round the other way (``TIE_S``).
    costs = StepCosts(t_step=0.001, t_token=0.0, t_kv=0.0, t_pair=0.0, e_step=1.0, e_token=0.0, e_kv=0.0,
                      e_pair=0.0, idle_w=10.0, max_num_seqs=2, max_batched_tokens=2, kv_capacity_tokens=20)

    def build() -> list[Seq]:
        return seqs((194 * 0.001, 1, 14), (207 * 0.001, 1, 1))

    (a, b), reference = build(), build()
    replica = replay(costs, [a, b])
    reference_replay(costs, reference)
    assert b.admitted == pytest.approx(a.arrived + 0.013)
    assert b.admitted >= b.arrived - TIE_S
    assert a.done == b.done == pytest.approx(a.arrived + 0.014)
    # a: its prefill step and 12 decode steps alone, the 13th shared with b's prefill.
    assert (a.energy_j, b.energy_j) == pytest.approx((13.5, 0.5))
    assert replica.energy_j == pytest.approx(14.0)
    for f, s in zip((a, b), reference, strict=True):
        for name in ("admitted", "first_token", "done", "energy_j"):
            assert getattr(f, name) == pytest.approx(getattr(s, name), rel=1e-9, abs=1e-9), name


# Random small workloads with exact ties. Arrivals are whole multiples of t_step, and in half the
# draws every step takes exactly t_step (the other time coefficients 0), so arrivals fall on
# step boundaries: the fast replica computes a boundary in closed form (run start + T(k)), the
# reference as a running sum of step times, and the two round differently. Both must still put
# an arrival on a boundary into the step that starts there (``replica.TIE_S``). Half the draws
# have a KV knee (the truth model's) that prompts and outputs cross.
requests = st.lists(
    st.tuples(st.integers(0, 400), st.integers(1, 120), st.integers(1, 40), st.sampled_from([None, "a", "b", "c"]),
              st.integers(1, 100)),
    min_size=1, max_size=30,
)
costs = st.builds(
    lambda t, e, seqs, budget, kv, steps_only: StepCosts(
        t_step=t[0], t_token=0.0 if steps_only else t[1], t_kv=0.0 if steps_only else t[2],
        t_pair=0.0 if steps_only else t[3], e_step=e[0], e_token=e[1], e_kv=e[2], e_pair=e[3],
        idle_w=10.0, max_num_seqs=seqs, max_batched_tokens=seqs + budget, kv_capacity_tokens=kv),
    st.tuples(st.floats(1e-3, 2e-2), st.floats(0, 1e-3), st.floats(0, 1e-4), st.floats(0, 1e-5)),
    st.tuples(st.floats(0.1, 10), st.floats(0, 1), st.floats(0, 0.1), st.floats(0, 0.01)),
    st.integers(1, 5), st.integers(0, 60), st.integers(20, 400), st.booleans(),
)
knees = st.one_of(st.none(), st.builds(KvKnee, st.integers(0, 150), st.floats(1.0, 4.0)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, costs, st.integers(1, 3), knees)
def test_the_fast_replica_matches_the_step_by_step_reference(
    spec: list[tuple[int, int, int, str | None, int]], step_costs: StepCosts, prefix_entries: int,
    knee: KvKnee | None,
) -> None:
    def build() -> list[Seq]:
        return [Seq(at * step_costs.t_step, prompt, output, key, prefix if key else 0)
                for at, prompt, output, key, prefix in spec]

    fast, slow = build(), build()
    replica = replay(step_costs, fast, prefix_entries, knee)
    busy = reference_replay(step_costs, slow, prefix_entries, knee)
    for i, (f, s) in enumerate(zip(fast, slow, strict=True)):
        for name in ("cached", "admitted", "first_token", "done", "energy_j"):
            assert getattr(f, name) == pytest.approx(getattr(s, name), rel=1e-9, abs=1e-9), (i, name)
    assert replica.busy_s == pytest.approx(busy, rel=1e-9)
    assert sum(f.energy_j for f in fast) == pytest.approx(replica.energy_j, rel=1e-9)
    assert (replica.running, replica.kv_held, replica.kv_reserved, replica.context_sum) == (0, 0, 0, 0)
    assert (replica.past, replica.excess) == (0, 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(costs, st.integers(1, 8), st.integers(3, 40), st.floats(0, 1, exclude_min=True, exclude_max=True))
def test_a_decode_run_cut_by_an_arrival_stops_at_a_step_that_starts_at_or_after_it(
    step_costs: StepCosts, prompt: int, output: int, where: float
) -> None:
    """An arrival in a pure-decode run gets the first step that starts at or after it, on the
    replica's own clock: never one that starts more than ``TIE_S`` before it, and, arriving
    exactly when the replica says a step starts, that very step (as when it arrives at the run's
    end)."""
    step_costs = StepCosts(**{**step_costs.as_dict(), "max_num_seqs": 2, "max_batched_tokens": 8,
                              "kv_capacity_tokens": 1000})
    start = 1234.5678

    def decoding() -> tuple[Replica, float, float]:
        """A replica in a decode run: a alone, past its prefill; the run's start and end."""
        replica = Replica(step_costs, lambda seq: None)
        assert replica.arrive(Seq(start, prompt, output), start) == start  # idle: its prefill step starts
        prefilled = replica.boundary(start)
        assert prefilled is not None
        end = replica.boundary(prefilled)
        assert end is not None and end > prefilled
        return replica, prefilled, end

    replica, prefilled, end = decoding()
    now = prefilled + where * (end - prefilled)
    then = replica.arrive(Seq(now, 1, 1), now)
    if then is None:  # no step starts in the run at or after ``now``: b joins at the run's end
        return
    assert now - TIE_S <= then < end
    twin, _, _ = decoding()
    assert twin.arrive(Seq(then, 1, 1), then) == then
