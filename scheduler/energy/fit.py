"""Fitting the step model: to published measurements, and to a calibration sweep (pure).

1. ``fit_physics``: the physical parameters of one GPU generation (``PhysicsAssumptions``:
   bandwidth and FLOP/s efficiencies, per-step overhead, per-phase shares of TDP; attention's
   FLOP/s efficiency is held at a published FlashAttention figure, ``HELD``) by
   Levenberg-Marquardt on log residuals of the published points (``scheduler.energy.published``):

       r = [log(J/token_model / J/token_published), log(tokens/s_model / tokens/s_published)]

   both through ``Roofline.costs`` (the same step costs the profiles ship). Throughput pins the
   efficiencies (time), energy per token then pins the power shares. Parameters are fitted in
   log space (all positive). ``leave_one_out`` refits without each point in turn and predicts
   it: those errors size the profiles' intervals.

2. ``fit_step_costs``: ``scheduler calibrate``'s sweep. One sweep point runs B identical
   requests together (prompt C, no prefix cache, exactly N output tokens) and meters energy E
   and duration T. Under the step model, with M the prefill token budget per step, the run's
   steps sum to (features of ``StepCosts``: 1, tokens, KV tokens read, attention pairs)

       steps  = ceil(B C / M) + (N - 1)               prefill chunks, then N - 1 decode steps
       tokens = B C + B (N - 1)
       kv     = B C^2 / (2 M) + B ((N - 1) C + N (N - 1) / 2)
       pairs  = B C^2 / 2     + B ((N - 1) C + N (N - 1) / 2)

   so E = e . x and T = t . x are linear in the terms: non-negative least squares on rows
   divided by the measurement (relative error; a term fitted below zero is dropped and the
   rest refitted). The idle floor comes from its own window with nothing running.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from scheduler.energy.published import Point, predicted_j_per_token, predicted_tokens_per_s
from scheduler.energy.step import (
    ATTENTION_MFU,
    VLLM_MAX_BATCHED_TOKENS,
    PhysicsAssumptions,
    Roofline,
    StepCosts,
    roofline,
)

# Parameters the published points cannot see are held at cited values (PhysicsAssumptions).
HELD = {"attention_mfu": ATTENTION_MFU}
PARAMETERS = tuple(f.name for f in fields(PhysicsAssumptions) if f.name not in HELD)
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PhysicsFit:
    assumptions: PhysicsAssumptions
    # Relative J/token error (model / published - 1) of each point the fit used, by id.
    errors: dict[str, float]
    rms_log_residual: float

    @property
    def max_abs_error(self) -> float:
        return max(abs(e) for e in self.errors.values())


def point_costs(point: Point, assumptions: PhysicsAssumptions) -> StepCosts:
    return _roofline(point).costs(assumptions)


def relative_error(point: Point, assumptions: PhysicsAssumptions) -> float:
    """Model / published - 1 for the point's J per output token."""
    return predicted_j_per_token(point_costs(point, assumptions), point) / point.j_per_token - 1.0


def fit_physics(
    points: Sequence[Point], start: PhysicsAssumptions | None = None, iterations: int = 60
) -> PhysicsFit:
    """Least squares of the log residuals (module doc) over ``points``."""
    if len(points) < len(PARAMETERS):
        raise ValueError(f"need at least {len(PARAMETERS)} points to fit {len(PARAMETERS)} parameters, got {len(points)}")
    lines = [_roofline(p) for p in points]
    theta = np.log(np.array([getattr(start or PhysicsAssumptions(), n) for n in PARAMETERS], dtype=float))
    theta = _levenberg_marquardt(lambda t: _residuals(t, points, lines), theta, iterations)
    assumptions = _assumptions(theta)
    residuals = _residuals(theta, points, lines)
    return PhysicsFit(
        assumptions=assumptions,
        errors={p.id: relative_error(p, assumptions) for p in points},
        rms_log_residual=float(np.sqrt(np.mean(residuals**2))),
    )


def leave_one_out(points: Sequence[Point], full: PhysicsFit) -> dict[str, float]:
    """For each point: the relative J/token error of a fit made without it (warm-started)."""
    errors = {}
    for i, point in enumerate(points):
        rest = [p for j, p in enumerate(points) if j != i]
        refit = fit_physics(rest, start=full.assumptions, iterations=25)
        errors[point.id] = relative_error(point, refit.assumptions)
    return errors


def _roofline(point: Point) -> Roofline:
    return roofline(point.model, point.gpu, point.precision, point.tensor_parallel)


def _assumptions(theta: FloatArray) -> PhysicsAssumptions:
    return PhysicsAssumptions(**HELD, **{n: float(math.exp(v)) for n, v in zip(PARAMETERS, theta, strict=True)})


def _residuals(theta: FloatArray, points: Sequence[Point], lines: Sequence[Roofline]) -> FloatArray:
    a = _assumptions(theta)
    out = np.empty(2 * len(points))
    for k, (point, line) in enumerate(zip(points, lines, strict=True)):
        costs = line.costs(a)
        out[2 * k] = math.log(predicted_j_per_token(costs, point) / point.j_per_token)
        out[2 * k + 1] = math.log(predicted_tokens_per_s(costs, point) / point.tokens_per_s)
    return out


def _levenberg_marquardt(
    f: Callable[[FloatArray], FloatArray], theta: FloatArray, iterations: int
) -> FloatArray:
    damping, h = 1e-2, 1e-6
    r = f(theta)
    cost = float(r @ r)
    for _ in range(iterations):
        jac = np.empty((len(r), len(theta)))
        for k in range(len(theta)):
            step = np.zeros(len(theta))
            step[k] = h
            jac[:, k] = (f(theta + step) - r) / h
        normal = jac.T @ jac
        gradient = jac.T @ r
        improved = False
        delta: FloatArray = np.zeros(len(theta))
        while damping < 1e8:
            delta = np.asarray(np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -gradient),
                               dtype=np.float64)
            trial = f(theta + delta)
            trial_cost = float(trial @ trial)
            if trial_cost < cost:
                theta, r, cost = theta + delta, trial, trial_cost
                damping = max(damping / 3.0, 1e-9)
                improved = True
                break
            damping *= 10.0
        if not improved or float(np.max(np.abs(delta))) < 1e-9:
            break
    return theta


# --- calibration sweeps ---------------------------------------------------------------------

TERMS = ("step", "token", "kv", "pair")


@dataclass(frozen=True, slots=True)
class SweepPoint:
    batch: int
    context: int
    output: int
    energy_j: float
    duration_s: float


@dataclass(frozen=True, slots=True)
class CalibrationFit:
    costs: StepCosts
    # Root-mean-square and worst relative residual of the energy fit (0.03 = 3 %).
    rel_rmse: float
    max_rel_residual: float
    time_rel_rmse: float
    points: int
    dropped_terms: tuple[str, ...]


def sweep_features(
    batch: int, context: int, output: int, max_batched_tokens: int = VLLM_MAX_BATCHED_TOKENS
) -> tuple[float, float, float, float]:
    """(steps, tokens, KV tokens read, attention pairs) of one sweep run (module doc)."""
    b, c, n, m = float(batch), float(context), float(output), float(max_batched_tokens)
    decode_context = (n - 1) * c + n * (n - 1) / 2
    return (
        math.ceil(b * c / m) + (n - 1),
        b * c + b * (n - 1),
        b * c * c / (2 * m) + b * decode_context,
        b * c * c / 2 + b * decode_context,
    )


def run_energy_j(costs: StepCosts, batch: int, context: int, output: int) -> float:
    x = sweep_features(batch, context, output, costs.max_batched_tokens)
    return float(np.dot(x, (costs.e_step, costs.e_token, costs.e_kv, costs.e_pair)))


def run_duration_s(costs: StepCosts, batch: int, context: int, output: int) -> float:
    x = sweep_features(batch, context, output, costs.max_batched_tokens)
    return float(np.dot(x, (costs.t_step, costs.t_token, costs.t_kv, costs.t_pair)))


def fit_step_costs(
    points: Sequence[SweepPoint],
    idle_w: float,
    max_batched_tokens: int = VLLM_MAX_BATCHED_TOKENS,
    kv_capacity_tokens: int = 0,
) -> CalibrationFit:
    if len(points) < len(TERMS):
        raise ValueError(f"need at least {len(TERMS)} sweep points to fit {len(TERMS)} terms, got {len(points)}")
    if any(p.energy_j <= 0 or p.duration_s <= 0 for p in points):
        raise ValueError("every sweep point needs a positive measured energy and duration")
    x = np.array([sweep_features(p.batch, p.context, p.output, max_batched_tokens) for p in points], dtype=float)
    energy, energy_dropped = _nonnegative_relative_fit(x, np.array([p.energy_j for p in points]))
    time, _ = _nonnegative_relative_fit(x, np.array([p.duration_s for p in points]))
    energy_res = (x @ energy) / np.array([p.energy_j for p in points]) - 1.0
    time_res = (x @ time) / np.array([p.duration_s for p in points]) - 1.0
    costs = StepCosts(
        t_step=float(time[0]), t_token=float(time[1]), t_kv=float(time[2]), t_pair=float(time[3]),
        e_step=float(energy[0]), e_token=float(energy[1]), e_kv=float(energy[2]), e_pair=float(energy[3]),
        idle_w=idle_w, max_batched_tokens=max_batched_tokens, kv_capacity_tokens=kv_capacity_tokens,
    )
    return CalibrationFit(
        costs=costs,
        rel_rmse=float(np.sqrt(np.mean(energy_res**2))),
        max_rel_residual=float(np.max(np.abs(energy_res))),
        time_rel_rmse=float(np.sqrt(np.mean(time_res**2))),
        points=len(points),
        dropped_terms=tuple(f"e_{TERMS[i]}" for i in energy_dropped),
    )


def _nonnegative_relative_fit(x: FloatArray, y: FloatArray) -> tuple[FloatArray, tuple[int, ...]]:
    """Least squares of x . c = y in relative terms with c >= 0 (drop the most negative term
    and refit until none is negative)."""
    rel = x / y[:, None]
    target = np.ones(len(y))
    active = list(range(x.shape[1]))
    solution = np.zeros(x.shape[1])
    while active:
        # Column scaling keeps the solve well conditioned (terms differ by 10^6).
        scale = np.linalg.norm(rel[:, active], axis=0)
        scale[scale == 0] = 1.0
        coef, *_ = np.linalg.lstsq(rel[:, active] / scale, target, rcond=None)
        coef = coef / scale
        if (coef >= 0).all():
            solution[:] = 0.0
            solution[active] = coef
            break
        active.pop(int(np.argmin(coef)))
    return solution, tuple(i for i in range(x.shape[1]) if i not in active)
