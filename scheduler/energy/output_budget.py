"""Output budgets: the ``max_tokens`` with the most quality per joule.

For a (model, task class) the operator supplies a table of quality against ``max_tokens``, from
their own evaluations: q(n) in [0, 1] is the share of answers still judged good when capped at n
tokens. For the chosen candidate the energy model gives E(n), the request's predicted energy with
``max_tokens = n`` (prefill plus n decode steps at the pool's expected batch, J). The budget is

    n* = argmax over the levels n <= requested of  q(n) / E(n)        [quality per kJ]

where the levels are the table's points at or below the request's ``max_tokens`` and the
requested value itself (its quality read off the table: linear between points, flat past the
last, 0 before the first at zero tokens). A budget never raises ``max_tokens``; ties go to the
larger n (more quality for the same utility per joule). Because prefill is paid whatever n is,
E(n) has a fixed part and n* sits where the table's quality stops rising faster than the energy.

The policy decides what happens with it (``output_budget.mode``): ``suggest`` puts n* in the
decision and the receipt and changes nothing; ``enforce`` also runs the request with
``max_tokens = n*``. Inputs: the policy's table, the decision's chosen candidate's energy
coefficients, the request's prompt, cached and requested tokens. Pure: no I/O.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class OutputBudget:
    """The utility-per-joule optimum for one request, and what it was compared with."""

    requested_max_tokens: int
    max_tokens: int  # n*: the suggested (or enforced) max_tokens
    quality_requested: float
    quality: float  # q(n*)
    energy_j_requested: float
    energy_j: float  # E(n*)
    mode: str  # suggest | enforce
    # True when the request runs with max_tokens = n* (enforce, and n* below the request's).
    enforced: bool

    @property
    def quality_per_kj(self) -> float:
        return self.quality / self.energy_j * 1000.0 if self.energy_j > 0 else 0.0


def quality_at(points: Sequence[tuple[int, float]], tokens: int) -> float:
    """q(tokens) from the table's (max_tokens, quality) points, sorted by tokens: linear between
    points, from (0, 0) to the first, flat past the last."""
    xs = [n for n, _ in points]
    i = bisect_right(xs, tokens)
    if i == len(points):
        return points[-1][1]
    n1, q1 = points[i]
    n0, q0 = points[i - 1] if i else (0, 0.0)
    return q0 + (q1 - q0) * (tokens - n0) / (n1 - n0)


def best_budget(points: Sequence[tuple[int, float]], requested: int, energy_j: Callable[[int], float],
                mode: str) -> OutputBudget:
    """The budget for a request asking ``requested`` tokens; ``energy_j(n)``: its predicted J at
    ``max_tokens = n``."""
    levels = sorted({n for n, _ in points if n < requested} | {requested})
    best_n, best_ratio, best_q, best_e = requested, -1.0, 0.0, 0.0
    for n in levels:
        q, e = quality_at(points, n), energy_j(n)
        ratio = q / e if e > 0 else 0.0
        if ratio >= best_ratio:  # ascending levels: a tie goes to the larger n
            best_n, best_ratio, best_q, best_e = n, ratio, q, e
    q_requested = quality_at(points, requested)
    e_requested = energy_j(requested)
    enforced = mode == "enforce" and best_n < requested
    return OutputBudget(requested, best_n, q_requested, best_q, e_requested, best_e, mode, enforced)
