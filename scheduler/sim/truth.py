"""The truth model: the step costs a simulated pool really runs at, unknown to the scheduler.

The scheduler predicts with the pool's rated ``StepCosts`` (``energy_model.rated_costs``). The
simulator runs and accounts each pool with the same costs perturbed once per pool by seeded
multiplicative errors, one per coefficient group g in (step, token, kv, pair):

    t_g' = t_g x f_g          f_g ~ lognormal(0, sigma)   (how much slower the kernels are)
    e_g' = e_g x f_g x p_g    p_g ~ lognormal(0, sigma)   (and how much more power they draw)
    idle_w' = idle_w x p_idle

so a pool whose kernels run slow also costs more energy. sigma = 0 gives the rated costs
(prediction error then comes only from the batch and queue a request really met). The
factors depend on (seed, region, pool) alone: every policy of a comparison meets the same
truth.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np

from scheduler.energy.step import StepCosts

GROUPS = ("step", "token", "kv", "pair")


def truth_costs(rated: StepCosts, sigma: float, seed: int, pool_key: str) -> StepCosts:
    """``rated`` perturbed for the pool named ``pool_key`` (e.g. "eu-north/h200-long")."""
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
