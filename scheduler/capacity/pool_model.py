"""One replica of a pool under steady load: its batch, energy per request, capacity and TTFT
SLO attainment, from the energy model's step costs (``scheduler.energy.step``).

At an expected batch B (the request itself included) the step model gives a request's energy
E(B) and its prefill time and time per output token; over the trace's token shape (means of
the features they are linear in) a request holds a slot of the replica for

    T(B) = prefill_s(B) + (N - 1) x tpot(B)                                    [s]

- **Slots** c: the most sequences the replica runs while the TPOT stays within the SLO, the
  KV cache holds their reservations (prompt + output) and vLLM's ``max_num_seqs`` allows.
- **Batch** at a per-replica arrival rate lambda (Poisson): the B with B = 1 + lambda T(B)
  (an arrival meets the lambda T others in service, as in M/G/inf), at most c.
- **Idle**: the replica runs no step with probability exp(-lambda T) (M/G/inf: the number in
  service is Poisson); then it draws ``idle_w``, which no request pays (as the simulator counts).
- **Capacity** at the target utilisation u: u c / T(c) requests/s.
- **TTFT SLO attainment**: the replica as an M/M/c queue of its c slots, service time T(c)
  (every slot busy: the slowest steps, a conservative bound); a request waits W with
  P(W > x) = C(c, a) exp(-(c mu - lambda) x) (Erlang C, a = lambda / mu), and meets the SLO
  when RTT + prefill + W <= its TTFT budget. At or above saturation only c mu / lambda of the
  requests are served at all, and none of them counts as within the SLO.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.capacity.demand import TokenShape
from scheduler.energy.step import RatedCosts, predict

# Fixed-point iterations of the batch equation (it converges geometrically below saturation).
BATCH_ITERATIONS = 60


@dataclass(frozen=True)
class ReplicaModel:
    rated: RatedCosts
    shape: TokenShape
    tpot_slo_s: float
    ttft_budget_s: float  # the class's TTFT budget at the mean prompt

    def occupancy_s(self, batch: float) -> float:
        """T(B): the mean time a request holds one of the replica's slots."""
        _, lat = predict(self.rated, batch, self.shape.context)
        s = self.shape
        prefill = lat.prefill_s + s.prompt * lat.prefill_s_per_token + s.prefill_pairs * lat.prefill_s_per_pair
        return prefill + s.decode_steps * lat.tpot_s + s.decode_context * lat.tpot_s_per_context_token

    def prefill_s(self, batch: float) -> float:
        _, lat = predict(self.rated, batch, self.shape.context)
        s = self.shape
        return lat.prefill_s + s.prompt * lat.prefill_s_per_token + s.prefill_pairs * lat.prefill_s_per_pair

    def tpot_s(self, batch: float) -> float:
        _, lat = predict(self.rated, batch, self.shape.context)
        return lat.tpot_s + self.shape.context * lat.tpot_s_per_context_token

    def energy_j(self, batch: float) -> float:
        """E(B): a request's mean energy at expected batch B (prefill, then N - 1 decode steps)."""
        energy, _ = predict(self.rated, batch, self.shape.context)
        s = self.shape
        return (s.prompt * energy.prefill_j_per_token + s.prefill_pairs * energy.prefill_j_per_pair
                + energy.start_j + s.decode_steps * energy.step_j + s.decode_context * energy.step_j_per_context_token)

    @property
    def idle_w(self) -> float:
        return self.rated.costs.idle_w

    def slots(self) -> int:
        """c: the most running sequences within the TPOT SLO, the KV cache and max_num_seqs (0:
        not even one request fits)."""
        costs = self.rated.costs
        limit = costs.max_num_seqs
        if costs.kv_capacity_tokens > 0:
            limit = min(limit, int(costs.kv_capacity_tokens // max(self.shape.reservation, 1.0)))
        if limit < 1 or self.tpot_s(1.0) > self.tpot_slo_s:
            return 0
        low, high = 1, limit  # tpot rises with the batch: the largest within the SLO, by bisection
        while low < high:
            mid = (low + high + 1) // 2
            if self.tpot_s(mid) <= self.tpot_slo_s:
                low = mid
            else:
                high = mid - 1
        return low

    def capacity_rps(self, slots: int, utilisation: float) -> float:
        return utilisation * slots / self.occupancy_s(slots) if slots > 0 else 0.0

    def batch_at(self, rps: float, slots: int) -> float:
        """The B with B = 1 + rps x T(B), at most ``slots`` (at least 1)."""
        batch = 1.0
        for _ in range(BATCH_ITERATIONS):
            batch = min(float(slots), 1.0 + rps * self.occupancy_s(batch))
        return max(1.0, batch)

    def ttft_attainment(self, rps: np.ndarray, slots: int, rtt_s: np.ndarray, rtt_weight: np.ndarray) -> np.ndarray:
        """Per per-replica arrival rate in ``rps``: the share of requests within the TTFT
        budget, over clients at round trips ``rtt_s`` with weights ``rtt_weight`` (module doc)."""
        service_s = self.occupancy_s(slots)
        mu = 1.0 / service_s
        offered = rps * service_s  # a, in slots
        waiting_p = erlang_c(slots, offered)
        slack = self.ttft_budget_s - self.prefill_s(slots) - rtt_s  # per client
        decay = np.maximum(slots * mu - rps, 0.0)  # per rate
        within = np.where(slack[None, :] >= 0,
                          1.0 - waiting_p[:, None] * np.exp(-decay[:, None] * np.maximum(slack, 0.0)[None, :]), 0.0)
        share = within @ rtt_weight
        attainment: np.ndarray = np.where(offered >= slots, 0.0, share)
        return attainment


def erlang_c(servers: int, offered: np.ndarray) -> np.ndarray:
    """P(wait > 0) in an M/M/c queue with ``servers`` and offered load a (per element of
    ``offered``); 1 at or above saturation. Erlang B by its recursion, then C from B."""
    a = np.asarray(offered, dtype=float)
    blocking = np.ones_like(a)
    for k in range(1, servers + 1):
        blocking = a * blocking / (k + a * blocking)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = servers * blocking / (servers - a * (1.0 - blocking))
    waits: np.ndarray = np.where(a >= servers, 1.0, np.clip(c, 0.0, 1.0))
    return waits


def cold_start_j(tdp_w: float, gpus: int, seconds: float, power_share: float) -> float:
    """Energy of starting one replica: its GPUs at ``power_share`` of TDP for ``seconds``."""
    return tdp_w * gpus * seconds * power_share


def idle_share(rps: float, occupancy_s: float) -> float:
    """Share of time a replica runs nothing (M/G/inf: exp(-mean number in service))."""
    return math.exp(-rps * occupancy_s)
