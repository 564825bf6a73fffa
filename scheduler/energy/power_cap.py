"""What a board power cap does to a replica's step costs, and the pool's efficient ("eco") cap.

A power cap (NVML's power management limit, per GPU) does nothing while the GPU draws less
than the cap. Above it the GPU's power controller lowers the SM clock until the board draws
the cap. The model (docs/power-caps.md):

1. The operating point. A replica's draw per GPU at a decode step of batch B and mean
   context X, from the step costs (``scheduler.energy.step``), term by term:

       term k   time T_k               energy E_k            bound by
       step     t_step                 e_step                memory (weights) + launch overhead
       token    B t_token              B e_token             compute (SM clock)
       kv       B X t_kv               B X e_kv              memory (HBM)
       pair     B X t_pair             B X e_pair            compute (SM clock)

   P_k = E_k / (T_k x TP), the draw while term k runs; P0 = sum E_k / (sum T_k x TP). The
   costs are what the GPUs did at their default limit (TDP: the published points were
   measured there), so P0 is taken at most TDP (each P_k scaled by TDP / P0 when the model
   says more). A cap C >= P0 is not binding: nothing changes ("the knee" is P0).

2. Below the knee, the clock ratio r (1 = the clock the GPU runs at its default limit)
   that makes the step draw C:

       P_k(r) = F + (P_k - F) g(r),   g(r) = r^3             for r >= r_v
                                      g(r) = r_v^2 r         for r <  r_v
       T_k(r) = T_k / r  (compute-bound terms),   T_k  (memory-bound terms)
       sum_k T_k(r) P_k(r) / sum_k T_k(r) = C   (solved for r by bisection)

   - g: CMOS dynamic power is C_eff V^2 f, and DVFS lowers the voltage with the clock
     (V ~ f) down to the voltage floor, below which only f falls (Mei, Wang, Chu, "A survey
     and measurement study of GPU DVFS on energy conservation", Digital Communications and
     Networks 3(2), 2017, arXiv:1610.01784).
   - r_v = ``VOLTAGE_FLOOR_CLOCK`` (0.75): an assumption. The energy of LLM inference on
     A100 is U-shaped in the SM clock between 1,005 and 1,410 MHz (0.71-1.0 of its boost
     clock; Voltana, supercomputing-system-ai-lab.github.io/projects/voltana), i.e. the
     voltage stops falling inside that range; 0.75 of the boost clock sits in it.
   - F = ``floor_w``: what does not scale with the SM clock (HBM, board, leakage at the
     floor): the larger of the GPU's idle draw and the draw the fit finds while a step
     waits on the CPU (``PhysicsAssumptions.overhead_power`` x TDP, 0.29 x TDP).
   - Memory-bound terms keep their time: decode "is largely insensitive to GPU frequency"
     (Maliakel, Ilager, Brandic, arXiv:2501.08219), and memory-bound decode draws below
     the caps that would matter (Ma et al., "The Illusion of Power Capping in LLM Decode",
     arXiv:2605.11999: 137-300 W on a 700 W H200, where no cap triggers).
   - r is held at ``MIN_CLOCK`` at least; a cap the model cannot reach there is reported
     (``Throttle.below_range``) and the clock stays at ``MIN_CLOCK``.

3. The capped step costs: every compute term's time / r; every term's energy times its
   time factor x P_k(r) / P_k. One clock for the whole step (the controller averages power
   over far longer than a step), set at the replica's decode operating point; prefill
   chunks in the same steps pay the same clock. So, below the knee, throughput and TPOT
   fall with the cap (their compute share slows as 1/r) and J per token falls while the
   dynamic power falls faster than the clock, until the voltage floor.

The efficient cap (``efficient_cap``): the cap in [``ECO_SEARCH_FROM`` x TDP, TDP] (steps of
``ECO_STEP_W``) that minimises the pool's J per output token at a reference busy replica
(``ECO_BATCH`` sequences, ``ECO_PROMPT``-token prompts, ``ECO_OUTPUT`` output tokens): the
mean over the pool's deployments of J/token(C) / J/token(TDP); of the caps within
``ECO_TOLERANCE`` of that minimum, the highest (the flat bottom of the curve costs speed,
not energy). Not measured on a capped GPU here: ``scripts/gpu_power_cap_check.py`` measures
it on one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from scheduler.energy.energy_model import EnergyModel
from scheduler.energy.hardware import GpuSpec
from scheduler.energy.model_catalogue import ModelSpec
from scheduler.energy.profile_energy_model import shipped_fit
from scheduler.energy.step import RatedCosts, StepCosts, predict

DVFS_EXPONENT = 3.0
VOLTAGE_FLOOR_CLOCK = 0.75
MIN_CLOCK = 0.3
ECO_BATCH = 64.0
ECO_PROMPT = 1024
ECO_OUTPUT = 256
ECO_SEARCH_FROM = 0.3
ECO_STEP_W = 5.0
ECO_TOLERANCE = 0.01
_BISECTIONS = 48

# Terms of a step (module doc): name, bound by compute (True) or memory (False).
TERMS = (("step", False), ("token", True), ("kv", False), ("pair", True))


@dataclass(frozen=True, slots=True)
class PowerCap:
    """A board power limit on each of a replica's ``tensor_parallel`` GPUs."""

    cap_w: float
    tdp_w: float
    floor_w: float
    tensor_parallel: int = 1

    @property
    def share(self) -> float:
        return self.cap_w / self.tdp_w


def default_floor_share() -> float:
    """Share of TDP the fit finds a GPU drawing while a step waits on the CPU
    (``published/fit.yaml``, ``overhead_power``): the draw that does not follow the SM clock."""
    return shipped_fit().assumptions.overhead_power


def floor_w(gpu: GpuSpec, floor_share: float | None = None) -> float:
    """Per GPU: the draw that does not scale with the SM clock (module doc, F)."""
    share = default_floor_share() if floor_share is None else floor_share
    return max(gpu.idle_w, share * gpu.tdp_w)


def power_cap(
    gpu: GpuSpec, cap_w: float | None, tensor_parallel: int = 1, floor_share: float | None = None
) -> PowerCap | None:
    """The cap as the model uses it; None for no cap or one at or above TDP (the default
    limit the step costs were measured at: nothing changes)."""
    if cap_w is None or cap_w >= gpu.tdp_w:
        return None
    if cap_w <= 0:
        raise ValueError(f"a power cap must be positive, got {cap_w} W")
    return PowerCap(float(cap_w), gpu.tdp_w, floor_w(gpu, floor_share), tensor_parallel)


@dataclass(frozen=True, slots=True)
class Throttle:
    """What a cap does at one operating point (per GPU figures)."""

    cap_w: float
    # The draw without the cap (at the default limit, at most TDP): the knee.
    draw_w: float
    # SM clock ratio under the cap (1.0: not binding).
    clock: float
    # The draw under the cap (= cap_w when binding and reachable).
    power_w: float
    # The cap is below what the model reaches at MIN_CLOCK.
    below_range: bool
    # Per term of TERMS: time and energy multipliers.
    time_factors: tuple[float, float, float, float]
    energy_factors: tuple[float, float, float, float]

    @property
    def binding(self) -> bool:
        return self.clock < 1.0


_UNCHANGED = (1.0, 1.0, 1.0, 1.0)


def _dynamic(r: float) -> float:
    if r >= VOLTAGE_FLOOR_CLOCK:
        return float(r**DVFS_EXPONENT)
    return float(VOLTAGE_FLOOR_CLOCK ** (DVFS_EXPONENT - 1.0) * r)


def _terms(costs: StepCosts, batch: float, context: float) -> tuple[tuple[float, float], ...]:
    b = max(batch, 1.0)
    x = max(context, 0.0)
    return (
        (costs.t_step, costs.e_step),
        (b * costs.t_token, b * costs.e_token),
        (b * x * costs.t_kv, b * x * costs.e_kv),
        (b * x * costs.t_pair, b * x * costs.e_pair),
    )


def throttle(costs: StepCosts, cap: PowerCap, batch: float, context: float) -> Throttle:
    """The clock and the per-term factors of ``cap`` at a decode step of ``batch`` sequences
    of mean context ``context`` (module doc)."""
    terms = _terms(costs, batch, context)
    tp = max(cap.tensor_parallel, 1)
    total_t = sum(t for t, _ in terms)
    total_e = sum(e for _, e in terms)
    if total_t <= 0 or total_e <= 0:
        return Throttle(cap.cap_w, 0.0, 1.0, 0.0, False, _UNCHANGED, _UNCHANGED)
    raw = total_e / (total_t * tp)
    scale = min(1.0, cap.tdp_w / raw)
    draw = raw * scale
    if cap.cap_w >= draw:
        return Throttle(cap.cap_w, draw, 1.0, draw, False, _UNCHANGED, _UNCHANGED)
    powers = [(e / (t * tp)) * scale if t > 0 else 0.0 for t, e in terms]
    f = cap.floor_w

    def phase_power(k: int, r: float) -> float:
        p = powers[k]
        return f + (p - f) * _dynamic(r) if p > f else p

    def average(r: float) -> float:
        num = den = 0.0
        for k, ((t, _), (_, compute)) in enumerate(zip(terms, TERMS, strict=True)):
            tt = t / r if compute else t
            num += tt * phase_power(k, r)
            den += tt
        return num / den

    below = average(MIN_CLOCK) > cap.cap_w
    if below:
        r = MIN_CLOCK
    else:
        lo, hi = MIN_CLOCK, 1.0
        for _ in range(_BISECTIONS):
            mid = 0.5 * (lo + hi)
            if average(mid) > cap.cap_w:
                hi = mid
            else:
                lo = mid
        r = lo
    time_f: list[float] = []
    energy_f: list[float] = []
    for k, (_, compute) in enumerate(TERMS):
        tau = 1.0 / r if compute else 1.0
        time_f.append(tau)
        # Energy of the term at the default limit is E_k = T_k P_k / scale (the model's own
        # figure); under the cap T_k tau P_k(r): the factor is tau P_k(r) / P_k.
        energy_f.append(tau * phase_power(k, r) / powers[k] if powers[k] > 0 else tau)
    return Throttle(
        cap.cap_w, draw, r, average(r), below,
        (time_f[0], time_f[1], time_f[2], time_f[3]), (energy_f[0], energy_f[1], energy_f[2], energy_f[3]),
    )


def capped_costs(costs: StepCosts, throttled: Throttle) -> StepCosts:
    """The step costs with ``throttled``'s factors (the idle floor and capacities unchanged)."""
    if not throttled.binding:
        return costs
    ts, ta, tk, tp = throttled.time_factors
    es, ea, ek, ep = throttled.energy_factors
    return StepCosts(
        costs.t_step * ts, costs.t_token * ta, costs.t_kv * tk, costs.t_pair * tp,
        costs.e_step * es, costs.e_token * ea, costs.e_kv * ek, costs.e_pair * ep,
        costs.idle_w, costs.max_num_seqs, costs.max_batched_tokens, costs.kv_capacity_tokens,
    )


def capped(rated: RatedCosts, cap: PowerCap | None, batch: float, context: float) -> RatedCosts:
    """``rated`` under ``cap`` at the operating point (``rated`` itself when there is no cap
    or it does not bind there). Same interval and provenance: the cap is config, shown apart."""
    if cap is None:
        return rated
    throttled = throttle(rated.costs, cap, batch, context)
    if not throttled.binding:
        return rated
    return RatedCosts(capped_costs(rated.costs, throttled), rated.rel_error, rated.provenance)


@dataclass(frozen=True, slots=True)
class CapPoint:
    """The reference request at one cap: J per output token, time per output token, prefill time."""

    cap_w: float
    j_per_token: float
    tpot_s: float
    clock: float
    prefill_s: float


def reference_point(rated: RatedCosts, cap: PowerCap | None, batch: float = ECO_BATCH,
                    prompt: int = ECO_PROMPT, output: int = ECO_OUTPUT) -> CapPoint:
    """J per output token and TPOT of a ``prompt``/``output`` request at ``batch`` under ``cap``."""
    context = prompt + output * 0.5
    clock = 1.0 if cap is None else throttle(rated.costs, cap, batch, context).clock
    energy, latency = predict(capped(rated, cap, batch, context), batch, context)
    joules = energy.prefill_joules(prompt, 0) + energy.decode_joules(prompt, output)
    tpot = latency.tpot_s + context * latency.tpot_s_per_context_token
    prefill = (latency.prefill_s + prompt * latency.prefill_s_per_token
               + prompt * prompt * 0.5 * latency.prefill_s_per_pair)
    return CapPoint(cap.cap_w if cap is not None else float("nan"), joules / output, tpot, clock, prefill)


@dataclass(frozen=True, slots=True)
class EfficientCap:
    """A pool's efficient cap and what it does at the reference request (ratios to TDP)."""

    cap_w: float
    tdp_w: float
    j_per_token_ratio: float
    tpot_ratio: float
    # The reference prompt's prefill time (compute-bound: it slows with the clock).
    prefill_ratio: float

    @property
    def share(self) -> float:
        return self.cap_w / self.tdp_w


@lru_cache(maxsize=512)
def _efficient(gpu: GpuSpec, deployments: tuple[tuple[RatedCosts, int], ...], floor_share: float | None) -> EfficientCap:
    bases = [reference_point(rated, None) for rated, _ in deployments]
    curve: list[tuple[float, float, float, float]] = []  # (cap, mean J, TPOT and prefill ratios)
    n = len(deployments)
    cap_w = gpu.tdp_w
    lowest = ECO_SEARCH_FROM * gpu.tdp_w
    while cap_w >= lowest - 1e-9:
        j_ratio = t_ratio = p_ratio = 0.0
        for (rated, tp), base in zip(deployments, bases, strict=True):
            point = reference_point(rated, power_cap(gpu, cap_w, tp, floor_share))
            j_ratio += point.j_per_token / base.j_per_token
            t_ratio += point.tpot_s / base.tpot_s
            p_ratio += point.prefill_s / base.prefill_s
        curve.append((cap_w, j_ratio / n, t_ratio / n, p_ratio / n))
        cap_w -= ECO_STEP_W
    best = min(c[1] for c in curve)
    chosen = max((c for c in curve if c[1] <= best * (1.0 + ECO_TOLERANCE)), key=lambda c: c[0])
    return EfficientCap(chosen[0], gpu.tdp_w, chosen[1], chosen[2], chosen[3])


def efficient_cap(
    gpu: GpuSpec,
    deployments: Sequence[tuple[ModelSpec, str, int]],
    energy_model: EnergyModel,
    floor_share: float | None = None,
) -> EfficientCap:
    """The cap minimising the pool's J per output token (module doc) for ``deployments``
    (model, precision, tensor parallelism) on ``gpu``."""
    if not deployments:
        raise ValueError("a pool without deployments has no efficient cap")
    rated = tuple((energy_model.rated_costs(m, gpu, precision, tp), tp) for m, precision, tp in deployments)
    return _efficient(gpu, rated, floor_share)


@dataclass(frozen=True, slots=True)
class PoolCap:
    """The caps of one pool: configured, efficient, and the one in effect.

    ``target_w`` is what the region sets on each GPU of the pool: the configured cap, or with
    the region's eco switch on, the efficient cap (never above the configured one: a cap set
    for a power budget stays)."""

    gpu: GpuSpec
    configured_w: float
    eco: bool
    eco_w: float
    target_w: float
    floor_w: float
    # What the efficient cap does at the reference busy replica (module doc).
    efficient: EfficientCap

    @property
    def tdp_w(self) -> float:
        return self.gpu.tdp_w

    def for_replica(self, tensor_parallel: int) -> PowerCap | None:
        return power_cap(self.gpu, self.target_w, tensor_parallel)


def pool_cap(
    gpu: GpuSpec,
    configured_w: float,
    eco: bool,
    deployments: Sequence[tuple[ModelSpec, str, int]],
    energy_model: EnergyModel,
) -> PoolCap:
    """The pool's caps (``PoolCap``) from its config: GPU, ``power_cap_w``, the region's eco
    switch and the deployments it serves."""
    efficient = efficient_cap(gpu, deployments, energy_model)
    target = min(configured_w, efficient.cap_w) if eco else configured_w
    return PoolCap(gpu, configured_w, eco, efficient.cap_w, target, floor_w(gpu), efficient)
