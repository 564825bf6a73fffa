"""The truth model: what a simulated pool really costs and what the network really takes,
unknown to the scheduler.

The scheduler predicts with the pool's rated ``StepCosts`` (``energy_model.rated_costs``, the
step model fitted to published measurements, ``scheduler.energy.fit``) and the network model
(``scheduler.framework.network``: RTT = 2 x great-circle km x 1.4 / 200,000 km/s + 2 ms). A
truth that is that same model plus noise grades the predictor against itself; the
``model-form`` truth (``TruthModel()``, the default of ``scheduler simulate``) differs from it
in form, in three ways, every parameter a field of ``TruthModel``:

1. **KV reads past a knee.** A context of c tokens reads

       kv(c) = c + (kv_knee_factor - 1) x max(0, c - kv_knee_tokens)

   KV-token equivalents per step (``scheduler.sim.replica.KvKnee``) where the step model reads
   c: past 4,096 tokens each further token's K and V cost 1.5 times as much time and energy
   (a decode's reads and a prefill chunk's reads of the prompt before it; the attention pairs
   stay linear). The step model cannot represent it: its KV slope was fitted at chat contexts
   (200-token prompts, a few hundred output tokens), so it under-predicts long contexts, more
   the longer they are. An assumed shape, not a measured one (docs/simulation.md, "Truth
   model").
2. **A per-GPU-type energy bias** drawn from the energy model's held-out residuals
   (``scheduler energy validate``: J per output token, model / published - 1, on the
   published points the fit never used; ``HeldOutResiduals``). Each GPU type draws one
   residual e, seeded by (seed, GPU), from its own held-out points (H100: 45), or, for a GPU
   without any, from those of the GPUs the fit did not measure (the interval class
   ``transfer`` the model itself assigns it: B200's 29 points for A100 and H200). Every
   energy coefficient of that GPU type's pools is multiplied by 1 / (1 + e): the published
   figure, where the model said 1 + e times it. Time is not biased (the held-out throughput
   residuals reach +203 % on B200, a new generation's software, not a transferable error).
3. **RTT jitter.** Each request's true round trip is its predicted RTT x exp(rtt_sigma x z),
   z ~ N(0, 1), plus ``rtt_tail_s`` for a share ``rtt_tail_share`` of requests (a lost packet
   waits for TCP's minimum retransmission timeout, 200 ms on Linux), drawn per request from
   (seed, request row): every policy of a comparison meets the same network.

and, as in the rated truth, a per-pool spread ``pool_sigma`` (silicon, cooling, power
limits): per coefficient group g in (step, token, kv, pair), seeded by (seed, region, pool),

    t_g' = t_g x f_g          f_g ~ lognormal(0, pool_sigma)   (how much slower the kernels are)
    e_g' = e_g x f_g x p_g    p_g ~ lognormal(0, pool_sigma)   (and how much more power they draw)
    idle_w' = idle_w x p_idle

``TruthModel.rated(sigma)`` is the simulator's truth before issue 25 (``--truth rated``): that
spread alone, at sigma (0.1 by default; 0: the rated costs exactly, the library default), no
knee, no GPU bias, the RTT as predicted. Every draw depends on the seed and the pool, GPU
type or request alone: every policy of a comparison meets the same truth.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from scheduler.energy.step import StepCosts
from scheduler.sim.replica import KvKnee

GROUPS = ("step", "token", "kv", "pair")
# RTT draws are made in blocks of this many request rows, each from its own seeded generator,
# so that a row's draw does not depend on where a time shard starts (``scheduler.sim.shards``).
RTT_BLOCK = 4096


@dataclass(frozen=True)
class TruthModel:
    """Every parameter of the simulator's truth (module doc). The defaults are the model-form
    truth of ``scheduler simulate``."""

    # Lognormal sigma of each pool's time and power factors per coefficient group (0: none).
    pool_sigma: float = 0.05
    # Past this context [tokens] a KV token's read costs ``kv_knee_factor`` times as much
    # (1.0: no knee, the step model's linear KV term).
    kv_knee_tokens: int = 4096
    kv_knee_factor: float = 1.5
    # Bias each GPU type's energy by a held-out residual of the energy model (``HeldOutResiduals``).
    gpu_bias: bool = True
    # Lognormal sigma of a request's true RTT around the predicted one (0: none).
    rtt_sigma: float = 0.2
    # Share of requests whose round trip also waits ``rtt_tail_s`` (a retransmission).
    rtt_tail_share: float = 0.01
    rtt_tail_s: float = 0.2

    def __post_init__(self) -> None:
        for name in ("pool_sigma", "rtt_sigma", "rtt_tail_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"truth model: {name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.rtt_tail_share <= 1.0:
            raise ValueError(f"truth model: rtt_tail_share must be in [0, 1], got {self.rtt_tail_share}")
        KvKnee(self.kv_knee_tokens, self.kv_knee_factor)  # checks them

    @classmethod
    def rated(cls, sigma: float = 0.1) -> TruthModel:
        """The rated step costs with the per-pool spread ``sigma`` alone (module doc)."""
        return cls(pool_sigma=sigma, kv_knee_factor=1.0, gpu_bias=False, rtt_sigma=0.0, rtt_tail_share=0.0)

    @property
    def name(self) -> str:
        """``rated`` when nothing but the per-pool spread is on, else ``model-form``."""
        rated = self.kv_knee_factor == 1.0 and not self.gpu_bias and self.rtt_sigma == 0 and self.rtt_tail_share == 0
        return "rated" if rated else "model-form"

    @property
    def exact_rtt(self) -> bool:
        """Whether every request's true RTT is the predicted one."""
        return self.rtt_sigma == 0 and (self.rtt_tail_share == 0 or self.rtt_tail_s == 0)

    @property
    def knee(self) -> KvKnee | None:
        return None if self.kv_knee_factor == 1.0 else KvKnee(self.kv_knee_tokens, self.kv_knee_factor)

    def costs(self, rated: StepCosts, gpu: str, seed: int, pool_key: str,
              residuals: HeldOutResiduals | None = None) -> StepCosts:
        """The true step costs of the pool ``pool_key`` ("region/pool") of GPU type ``gpu``:
        ``rated`` with the pool's spread and the GPU type's energy bias (``residuals``: needed
        with ``gpu_bias``)."""
        costs = truth_costs(rated, self.pool_sigma, seed, pool_key)
        if not self.gpu_bias:
            return costs
        if residuals is None:
            raise ValueError("the GPU bias needs the energy model's held-out residuals")
        return costs.scaled(energy_factor=energy_bias(residuals.for_gpu(gpu), seed, gpu))

    def rtt_draws(self, seed: int, first_row: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Per request row ``first_row`` .. ``first_row + rows - 1``: the factor on its
        predicted RTT and the time added to it [s] (module doc)."""
        if rows <= 0:
            return np.ones(0), np.zeros(0)
        first_block, last_block = first_row // RTT_BLOCK, (first_row + rows - 1) // RTT_BLOCK
        factors, tails = [], []
        for block in range(first_block, last_block + 1):
            rng = np.random.default_rng([seed, zlib.crc32(b"rtt"), block])
            z = rng.standard_normal(RTT_BLOCK)
            lost = rng.random(RTT_BLOCK) < self.rtt_tail_share
            factors.append(np.exp(self.rtt_sigma * z))
            tails.append(np.where(lost, self.rtt_tail_s, 0.0))
        start = first_row - first_block * RTT_BLOCK
        return np.concatenate(factors)[start:start + rows], np.concatenate(tails)[start:start + rows]

    def describe(self, gpus: Iterable[str] = (), seed: int = 0,
                 residuals: HeldOutResiduals | None = None) -> dict[str, Any]:
        """The parameters, and with ``gpu_bias`` each of ``gpus``' drawn energy factor."""
        out: dict[str, Any] = {"name": self.name, **dataclasses.asdict(self)}
        if self.gpu_bias and residuals is not None:
            out["gpu_energy_factor"] = {gpu: energy_bias(residuals.for_gpu(gpu), seed, gpu) for gpu in sorted(set(gpus))}
        return out


# The rated step costs exactly and the RTT as predicted (the library's default truth).
EXACT_TRUTH = TruthModel.rated(0.0)


@dataclass(frozen=True)
class HeldOutResiduals:
    """The energy model's relative J-per-output-token errors (model / published - 1) on the
    published points it was not fitted to (``role: held_out``), per GPU type, and the set a
    GPU without points of its own draws from: those of the GPUs the fit did not measure."""

    by_gpu: Mapping[str, tuple[float, ...]]
    measured_gpus: tuple[str, ...]

    @classmethod
    def load(cls) -> HeldOutResiduals:
        """From ``scheduler/energy/published`` (points.yaml, fit.yaml), as ``scheduler energy
        validate`` computes them."""
        from scheduler.energy.derive import load_fit
        from scheduler.energy.validate import rows

        by_gpu: dict[str, list[float]] = {}
        for row in rows():
            by_gpu.setdefault(row.gpu, []).append(row.error)
        return cls(MappingProxyType({gpu: tuple(errors) for gpu, errors in sorted(by_gpu.items())}),
                   tuple(load_fit().measured_gpus))

    def for_gpu(self, gpu: str) -> tuple[float, ...]:
        """``gpu``'s own residuals, or those of its interval class (measured or transfer)."""
        own = self.by_gpu.get(gpu)
        if own:
            return own
        measured = gpu in self.measured_gpus
        pooled = tuple(e for g, errors in self.by_gpu.items() if (g in self.measured_gpus) == measured for e in errors)
        if not pooled:
            raise ValueError(f"no held-out residuals for {gpu} or its interval class")
        return pooled


def energy_bias(residuals: tuple[float, ...], seed: int, gpu: str) -> float:
    """1 / (1 + e) for the residual e drawn for ``gpu`` (uniformly among ``residuals``,
    seeded by (seed, gpu))."""
    rng = np.random.default_rng([seed, zlib.crc32(f"gpu-bias/{gpu}".encode())])
    error = residuals[int(rng.integers(len(residuals)))]
    return 1.0 / (1.0 + error)


def truth_costs(rated: StepCosts, sigma: float, seed: int, pool_key: str) -> StepCosts:
    """``rated`` with the per-pool spread ``sigma`` for the pool named ``pool_key`` (e.g.
    "eu-north/h200-long"; module doc)."""
    if sigma < 0:
        raise ValueError(f"truth error must be >= 0, got {sigma}")
    if sigma == 0:
        return rated
    rng = np.random.default_rng([seed, zlib.crc32(pool_key.encode())])
    time_f = np.exp(sigma * rng.standard_normal(len(GROUPS)))
    power_f = np.exp(sigma * rng.standard_normal(len(GROUPS) + 1))
    t = dict(zip(GROUPS, time_f.tolist(), strict=True))
    e = {group: t[group] * p for group, p in zip(GROUPS, power_f.tolist(), strict=False)}
    return dataclasses.replace(
        rated,
        t_step=rated.t_step * t["step"], t_token=rated.t_token * t["token"], t_kv=rated.t_kv * t["kv"],
        t_pair=rated.t_pair * t["pair"], e_step=rated.e_step * e["step"], e_token=rated.e_token * e["token"],
        e_kv=rated.e_kv * e["kv"], e_pair=rated.e_pair * e["pair"], idle_w=rated.idle_w * float(power_f[-1]),
    )

