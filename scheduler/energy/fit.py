"""Fitting a profile to measured sweep points (pure; ``scheduler calibrate`` feeds it).

One sweep point runs B identical requests together (prompt C, no prefix cache, exactly N
output tokens) and meters the energy E of the whole run. Under the model
(``scheduler.energy.model``), summing over the B requests and the N decode steps:

    E = e_prefill x B C + e_start x B + e_weights x N r(B) + e_seq x B N + e_kv x B N (C + (N - 1) / 2)

which is linear in the five terms, so they come from a least-squares fit. Rows are divided
by the measured E (the fit minimises relative error: a 1 J point weighs as much as a 1 kJ
one), terms are kept non-negative (a term fitted below zero is dropped and the rest refitted),
and the idle floor comes from its own window with the model loaded and nothing running.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.energy.model import ReplicaEnergy

TERMS = ("prefill_j_per_token", "start_j", "step_weights_j", "step_seq_j", "step_kv_j_per_token")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    batch: int
    context: int
    output: int
    energy_j: float
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class FitResult:
    replica: ReplicaEnergy
    # Root-mean-square relative residual over the points (0.03 = 3 %).
    rel_rmse: float
    max_rel_residual: float
    points: int
    dropped_terms: tuple[str, ...]


def design_row(point: SweepPoint, weights_read_ratio: Callable[[float], float]) -> tuple[float, ...]:
    b, c, n = float(point.batch), float(point.context), float(point.output)
    return (b * c, b, n * weights_read_ratio(b), b * n, b * n * (c + (n - 1) / 2))


def predicted_run_j(replica: ReplicaEnergy, point: SweepPoint, weights_read_ratio: Callable[[float], float]) -> float:
    row = design_row(point, weights_read_ratio)
    values = (replica.prefill_j_per_token, replica.start_j, replica.step_weights_j, replica.step_seq_j,
              replica.step_kv_j_per_token)
    return sum(x * v for x, v in zip(row, values, strict=True))


def fit_replica(
    points: Sequence[SweepPoint],
    idle_w: float,
    weights_read_ratio: Callable[[float], float] = lambda b: 1.0,
) -> FitResult:
    if len(points) < len(TERMS):
        raise ValueError(f"need at least {len(TERMS)} sweep points to fit {len(TERMS)} terms, got {len(points)}")
    if any(p.energy_j <= 0 for p in points):
        raise ValueError("every sweep point needs a positive measured energy")
    a = np.array([design_row(p, weights_read_ratio) for p in points], dtype=float)
    y = np.array([p.energy_j for p in points], dtype=float)
    a_rel = a / y[:, None]
    target = np.ones(len(points))
    active = list(range(len(TERMS)))
    solution = np.zeros(len(TERMS))
    while active:
        # Column scaling keeps the solve well conditioned (terms differ by 10^6).
        scale = np.linalg.norm(a_rel[:, active], axis=0)
        scale[scale == 0] = 1.0
        coef, *_ = np.linalg.lstsq(a_rel[:, active] / scale, target, rcond=None)
        coef = coef / scale
        if (coef >= 0).all():
            solution[:] = 0.0
            solution[active] = coef
            break
        active.pop(int(np.argmin(coef)))
    residuals = a_rel @ solution - 1.0
    prefill, start, weights, seq, kv = (float(v) for v in solution)
    replica = ReplicaEnergy(prefill, start, weights, seq, kv, idle_w)
    return FitResult(
        replica=replica,
        rel_rmse=float(np.sqrt(np.mean(residuals**2))),
        max_rel_residual=float(np.max(np.abs(residuals))),
        points=len(points),
        dropped_terms=tuple(TERMS[i] for i in range(len(TERMS)) if i not in active),
    )
