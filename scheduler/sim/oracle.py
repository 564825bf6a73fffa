"""A hindsight bound on a run's fleet gCO2e: ``scheduler simulate --oracle``.

The same trace, fleet, truth and hard rules as the simulated policies, placed with hindsight:
a linear program over the run's hours, solved with HiGHS (``scipy.optimize.linprog(method=
"highs")``), with the true hourly intensities. Its optimum is what no policy could beat on this
trace by more than what the program leaves out (below), and each policy's ``gap_to_oracle`` is
its fleet gCO2e per request over the bound's, minus 1.

Requests are grouped by (hour of arrival, the pools their hard rules allow, size band of
prompt + output tokens). A pool is allowed for a request when it serves the model, the
request's residency rule admits its region, its KV cache holds the request (prompt + output
<= the candidate's KV capacity), and the predicted RTT + the unloaded prefill on the pool's
true step costs is within the request's TTFT budget (the SLO filter's test without a queue).
Per group g and pool p, from the pool's true step costs (``scheduler.sim.truth``):

    B        = min(max_num_seqs, KV capacity // (prompt + output))   the largest batch of such requests
    cached   = min(prefix tokens, prompt - 1) for a request with a shared prefix (every one a hit)
    E[g,p]   = sum over g's requests of the prefill of prompt - cached tokens after cached ones and
               output - 1 decode steps (the step model's token, KV and pair terms) + output x e_step / B
    T[g,p]   = the same with the time coefficients (a replica's busy seconds they take)

Variables: y[g,p] >= 0, the share of group g on pool p (sum over p = 1); n[h,p], the pool's warm
replicas in hour h (its autoscaler's min_replicas <= n <= max_replicas, within the replicas its
GPUs hold; fixed sizes: n = those); u[h,p] >= n[h,p] - n[h-1,p], u >= 0, the replicas started
(n before the first hour: the initial ones). Each pool's bounds and cold_start_j are the ones the
simulator runs it with (``AutoscalingSettings.for_pool``: its region file or the Ray Serve app's
default, the router's cold start).
With w[h,p] = PUE x the zone's true intensity in hour h / 3.6e6 [g/J] and L[h] the seconds of
hour h between the first and the last arrival:

    minimise  sum w[h,p] (sum_g y[g,p] (E[g,p] - idle_w T[g,p]) + idle_w L[h] n[h,p] + cold_start_j u[h,p])
    s.t.      sum_g y[g,p] T[g,p] <= L[h] n[h,p]          (busy time within the warm replicas' time)

What it relaxes (so it is a bound, and a loose one): replicas are fractional (integrality); no
queue, no TTFT beyond the unloaded prefill, no step granularity: a replica's every second can
be busy and every request batches at B; every shared prefix hits; the KV knee is left out of
the energy; within an hour warm replicas follow the load exactly (no autoscaler delay, no cold
start time, only its energy); RTT is the predicted one (the truth's jitter is left out). What
it restricts: a group is split across pools in shares, each request at the group's mean (a
per-request placement could put a group's long requests on one pool and its short ones on
another); the size bands keep that small. Requests no pool admits are left out of the bound's
requests, as the simulator counts them unschedulable; so is the share of a group that no pool's
warm replicas can hold in its hour (capacity binds at every pool's max_replicas): a slack
variable per group, priced above anything a placement could save, takes it (``unplaced``
counts both), so an overloaded trace gives a bound over what fits instead of no solution.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_matrix

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder, replicas_of
from scheduler.energy.step import StepCosts
from scheduler.framework.network import rtt_row
from scheduler.framework.slo import class_ttft_budget_s
from scheduler.policy import Policy
from scheduler.sim.autoscale import AutoscalingSettings
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.report import PolicyResult
from scheduler.sim.scenario import ScenarioSpec
from scheduler.sim.truth import HeldOutResiduals, TruthModel
from scheduler.sim.workload import Workload, build_workload, load_trace
from scheduler.types import WORKLOAD_CLASSES, Candidate, GeoPoint
from scheduler.units import J_PER_KWH

# Upper ends of the size bands (prompt + output tokens) requests are grouped by.
SIZE_BANDS = (256, 512, 1024, 2048, 4096, 8192, 16384, 1 << 62)


@dataclass(frozen=True)
class BoundPool:
    """A pool of the bound: its place, region's residency and PUE, zone, true costs, replicas."""

    place: str
    jurisdiction: str
    zone: str
    pue: float
    lat: float
    lon: float
    kv_capacity_tokens: int
    costs: StepCosts
    replicas: int
    # the pool's model deployment, whose autoscaling and cold start the bound takes
    candidate: Candidate


@dataclass(frozen=True)
class Bound:
    """The bound's solution: grams, kWh (with PUE), requests placed, and each pool's share."""

    fleet_gco2e: float
    fleet_kwh: float
    requests: int
    unplaced: int
    pool_share: dict[str, float]
    variables: int
    solve_s: float
    # fleet_gco2e split as the simulator's report splits a policy's: the requests' own energy,
    # the warm replicas' idle time, the cold starts [g]; and the warm replica-hours
    charged_gco2e: float = 0.0
    idle_gco2e: float = 0.0
    cold_start_gco2e: float = 0.0
    warm_replica_h: float = 0.0

    @property
    def fleet_gco2e_per_request(self) -> float:
        return self.fleet_gco2e / self.requests if self.requests else 0.0

    def to_json(self) -> dict[str, Any]:
        return {"fleet_gco2e_per_request": self.fleet_gco2e_per_request, "fleet_gco2e": self.fleet_gco2e,
                "fleet_kwh": self.fleet_kwh, "requests": self.requests, "unplaced": self.unplaced,
                "pool_share": self.pool_share, "variables": self.variables, "solve_s": round(self.solve_s, 3),
                "charged_gco2e": self.charged_gco2e, "idle_gco2e": self.idle_gco2e,
                "cold_start_gco2e": self.cold_start_gco2e, "warm_replica_h": self.warm_replica_h}

    def describe(self) -> str:
        shares = ", ".join(f"{place} {share * 100:.1f}%" for place, share in
                           sorted(self.pool_share.items(), key=lambda kv: -kv[1]) if share >= 0.001)
        return (f"oracle (hindsight LP bound): fleet gCO2e/request {self.fleet_gco2e_per_request:.5f}, "
                f"fleet kWh {self.fleet_kwh:.1f}, {self.requests:,} requests placed ({self.unplaced:,} none "
                f"admits or holds), {self.variables:,} variables, solved in {self.solve_s:.1f} s; pools: {shares}")


def request_cost(costs: StepCosts, prompt: np.ndarray, output: np.ndarray, cached: np.ndarray,
                 kv_capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Per request, (energy [J], busy time [s]) it takes on a replica with ``costs`` at the
    largest batch of such requests (module doc): its prefill after ``cached`` tokens, its decode
    steps, and its share of every step's fixed cost."""
    batch = np.clip(kv_capacity // np.maximum(1, prompt + output), 1, costs.max_num_seqs)
    m = prompt - cached
    n = output - 1
    prefill_pairs = m * cached + m * (m + 1) / 2
    decode_kv = n * prompt + n * (n + 1) / 2
    tokens = m + n
    energy = (costs.e_token * tokens + costs.e_kv * (cached + decode_kv) + costs.e_pair * (prefill_pairs + decode_kv)
              + costs.e_step * output / batch)
    busy = (costs.t_token * tokens + costs.t_kv * (cached + decode_kv) + costs.t_pair * (prefill_pairs + decode_kv)
            + costs.t_step * output / batch)
    return energy, busy


def bound_pools(regions: tuple[RegionConfig, ...], policy: PolicyConfig, model: str, truth: TruthModel,
                seed: int) -> list[BoundPool]:
    """The pools serving ``model``, each with its true step costs (as the simulator builds them)."""
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(policy), models=frozenset((model,)))
    residuals = HeldOutResiduals.load() if truth.gpu_bias else None
    pools: dict[str, BoundPool] = {}
    for c in builder.candidates:
        place = f"{c.region.name}/{c.pool.name}"
        if c.deployment.name != model or place in pools:
            continue
        d = c.deployment
        rated = builder.energy_model.rated_costs(c.model, c.gpu, d.precision, d.tensor_parallel).costs
        pools[place] = BoundPool(place, c.region.jurisdiction, c.region.grid_zone, c.region.pue,
                                 c.region.location.lat, c.region.location.lon, c.kv_capacity_tokens,
                                 truth.costs(rated, c.gpu.name, seed, place, residuals), replicas_of(c), c)
    return list(pools.values())


def solve(workload: Workload, pools: Sequence[BoundPool], policy: Policy, carbon: CarbonReplay,
          autoscaling: AutoscalingSettings | None, end_s: float | None = None) -> Bound:
    """The LP of the module doc on ``workload``; ``end_s``: when the run ends (default: the
    last arrival), for the warm replicas' time of the last hour."""
    began = time.perf_counter()
    n = len(workload)
    arrival = np.asarray(workload.arrival_s, dtype=np.float64)
    prompt = np.asarray(workload.prompt_tokens, dtype=np.int64)
    output = np.maximum(1, np.asarray(workload.output_tokens, dtype=np.int64))
    prefix = np.where(np.asarray(workload.prefix_group) >= 0, np.asarray(workload.prefix_tokens), 0)
    cached = np.minimum(prefix, prompt - 1).clip(min=0)
    start, end = float(arrival[0]), float(end_s if end_s is not None else arrival[-1])
    first_hour = int(start // 3600)
    hours = int(end // 3600) - first_hour + 1
    hour = (arrival // 3600).astype(np.int64) - first_hour
    # seconds of each hour inside [start, end]
    length = np.asarray([min(end, (first_hour + h + 1) * 3600.0) - max(start, (first_hour + h) * 3600.0)
                         for h in range(hours)])
    length = np.maximum(length, 1e-9)

    # allowed[r, p]: the hard rules of the module doc
    budget = np.asarray([class_ttft_budget_s(policy, WORKLOAD_CLASSES[k], int(t))
                         for k, t in zip(workload.workload_class, workload.prompt_tokens, strict=True)])
    city = np.asarray(workload.city, dtype=np.int64)
    restricted = np.asarray(workload.restricted, dtype=bool)
    allowed = np.zeros((n, len(pools)), dtype=bool)
    lat = np.radians([p.lat for p in pools])
    lon = np.radians([p.lon for p in pools])
    rtt = np.asarray([rtt_row(lat, lon, GeoPoint(c.lat, c.lon)) for c in workload.cities])  # city x pool
    for j, pool in enumerate(pools):
        c = pool.costs
        m = prompt - cached
        prefill_s = c.t_step + c.t_token * m + c.t_kv * cached + c.t_pair * (m * cached + m * (m + 1) / 2)
        city_ok = np.asarray([j == pool.jurisdiction for j in workload.city_jurisdiction], dtype=bool)
        jurisdiction_ok = ~restricted | city_ok[city]
        fits = prompt + output <= pool.kv_capacity_tokens
        allowed[:, j] = jurisdiction_ok & fits & (rtt[city, j] + prefill_s <= budget)
    placed = allowed.any(axis=1)
    band = np.searchsorted(np.asarray(SIZE_BANDS), prompt + output)
    mask_bits = allowed.astype(np.int64) @ (1 << np.arange(len(pools), dtype=np.int64))
    keys = np.stack([hour, mask_bits, band], axis=1)[placed]
    group_keys, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.ravel()
    groups = len(group_keys)
    rows = np.flatnonzero(placed)
    group_energy = np.zeros((groups, len(pools)))
    group_busy = np.zeros((groups, len(pools)))
    for j, pool in enumerate(pools):
        energy, busy = request_cost(pool.costs, prompt[rows], output[rows], cached[rows], pool.kv_capacity_tokens)
        group_energy[:, j] = np.bincount(group_of, weights=energy, minlength=groups)
        group_busy[:, j] = np.bincount(group_of, weights=busy, minlength=groups)
    group_allowed = allowed[rows[np.unique(group_of, return_index=True)[1]]]
    group_hour = group_keys[:, 0]
    counts = np.bincount(group_of, minlength=groups)

    # weights [g/J] per hour and pool
    weight = np.asarray([[p.pue * carbon.intensity(p.zone, (first_hour + h) * 3600.0) / J_PER_KWH for p in pools]
                         for h in range(hours)])
    idle_w = np.asarray([p.costs.idle_w for p in pools])
    fixed = autoscaling is None
    # each pool's own autoscaling and cold start, as the simulator runs it (scheduler.sim.autoscale)
    settings = [(autoscaling or AutoscalingSettings()).for_pool(p.candidate, p.costs.max_num_seqs) for p in pools]
    low = np.asarray([p.replicas if fixed else s.bounds(p.replicas)[0] for p, s in zip(pools, settings, strict=True)],
                     dtype=float)
    high = np.asarray([p.replicas if fixed else s.bounds(p.replicas)[1] for p, s in zip(pools, settings, strict=True)],
                      dtype=float)
    initial = np.asarray([p.replicas if fixed else s.initial(p.replicas) for p, s in zip(pools, settings, strict=True)],
                         dtype=float)
    cold_j = np.asarray([s.cold_start_j for s in settings])

    # variables: y (groups x pools, allowed only), n (hours x pools), u (hours x pools), z (groups:
    # the share of each that no pool holds)
    y_index = -np.ones((groups, len(pools)), dtype=np.int64)
    y_index[group_allowed] = np.arange(int(group_allowed.sum()))
    ny = int(group_allowed.sum())
    hp = hours * len(pools)
    n_at = ny + np.arange(hp).reshape(hours, len(pools))
    u_at = ny + hp + np.arange(hp).reshape(hours, len(pools))
    z_at = ny + 2 * hp + np.arange(groups)
    size = ny + 2 * hp + groups
    cost = np.zeros(size)
    g_idx, p_idx = np.nonzero(group_allowed)
    w_gp = weight[group_hour[g_idx], p_idx]
    cost[y_index[g_idx, p_idx]] = w_gp * (group_energy[g_idx, p_idx] - idle_w[p_idx] * group_busy[g_idx, p_idx])
    cost[n_at] = weight * idle_w * length[:, None]
    cost[u_at] = weight * cold_j
    # A request left out costs more than any placement could save: its own energy, an hour of a
    # replica's idle power and a cold start, at the dirtiest hour, ten times over.
    most_j = float((group_energy / np.maximum(1, counts)[:, None]).max(initial=0.0))
    left_out_g = 10.0 * float(weight.max(initial=0.0)) * (most_j + float(idle_w.max(initial=0.0)) * 3600.0
                                                          + float(cold_j.max(initial=0.0)))
    cost[z_at] = left_out_g * counts
    # equalities: each group's shares (and what is left out of it) sum to 1
    eq = coo_matrix((np.ones(ny + groups), (np.concatenate([g_idx, np.arange(groups)]),
                                            np.concatenate([y_index[g_idx, p_idx], z_at]))), shape=(groups, size))
    # inequalities: busy <= L n; n[h-1] - n[h] - u[h] <= -0 (u >= n[h] - n[h-1]), n[-1] = initial
    cap_rows = group_hour[g_idx] * len(pools) + p_idx
    h_all, p_all = np.divmod(np.arange(hp), len(pools))
    ub_rows = np.concatenate([cap_rows, np.arange(hp), hp + np.arange(hp), hp + np.arange(hp),
                              hp + np.arange(len(pools), hp)])
    ub_cols = np.concatenate([y_index[g_idx, p_idx], n_at.ravel(), n_at.ravel(), u_at.ravel(),
                              n_at[:-1].ravel()])
    ub_vals = np.concatenate([group_busy[g_idx, p_idx], -length[h_all], np.ones(hp), -np.ones(hp),
                              -np.ones(hp - len(pools))])
    ub = coo_matrix((ub_vals, (ub_rows, ub_cols)), shape=(2 * hp, size))
    b_ub = np.zeros(2 * hp)
    b_ub[hp:hp + len(pools)] = initial  # n[0] - u[0] <= initial
    bounds = np.zeros((size, 2))
    bounds[:ny, 1] = np.inf
    bounds[n_at.ravel(), 0] = low[p_all]
    bounds[n_at.ravel(), 1] = high[p_all]
    bounds[u_at.ravel(), 1] = np.inf
    bounds[z_at, 1] = 1.0
    result = linprog(cost, A_ub=ub.tocsr(), b_ub=b_ub, A_eq=eq.tocsr(), b_eq=np.ones(groups), bounds=bounds,
                     method="highs")
    if result.status != 0:
        raise RuntimeError(f"the hindsight LP was not solved: {result.message}")
    x = result.x
    shares = np.zeros((groups, len(pools)))
    shares[g_idx, p_idx] = x[y_index[g_idx, p_idx]]
    left_out = x[z_at] * counts
    fleet_gco2e = float(result.fun) - float((cost[z_at] * x[z_at]).sum())
    requests = round(float(placed.sum() - left_out.sum()))
    warm = x[n_at]
    charged = (shares * group_energy).sum(axis=0)
    idle = (idle_w * (warm * length[:, None]).sum(axis=0)) - idle_w * (shares * group_busy).sum(axis=0)
    cold = cold_j * x[u_at].sum(axis=0)
    pue = np.asarray([p.pue for p in pools])
    per_pool = (shares * counts[:, None]).sum(axis=0)
    charged_g = float((w_gp * group_energy[g_idx, p_idx] * shares[g_idx, p_idx]).sum())
    cold_g = float((weight * cold_j * x[u_at]).sum())
    return Bound(
        fleet_gco2e=fleet_gco2e,
        fleet_kwh=float(((charged + idle + cold) * pue).sum() / J_PER_KWH),
        requests=requests,
        unplaced=n - requests,
        pool_share={p.place: float(per_pool[j] / max(1, requests)) for j, p in enumerate(pools)},
        variables=size,
        solve_s=time.perf_counter() - began,
        charged_gco2e=charged_g,
        idle_gco2e=fleet_gco2e - charged_g - cold_g,
        cold_start_gco2e=cold_g,
        warm_replica_h=float((warm * length[:, None]).sum() / 3600.0),
    )


def solve_bound(spec: ScenarioSpec, policy: str = "default") -> Bound:
    """The bound of a ``ScenarioSpec``'s run, with ``policy``'s SLOs (the shipped policies
    share theirs)."""
    fleet = load_fleet(spec.regions_dir, spec.policies_dir)
    regions = spec.regions()
    workload = build_workload(load_trace(spec.trace), spec.workload, spec.seed)
    carbon = CarbonReplay.from_dir(spec.carbon_dir, [r.grid_zone for r in regions], spec.carbon_year,
                                   spec.carbon_delay_s, spec.carbon_outages)
    pools = bound_pools(regions, fleet.policy(policy), workload.model, spec.truth, spec.seed)
    return solve(workload, pools, compile_policy(fleet.policy(policy)), carbon, spec.autoscaling)


def with_gaps(results: Sequence[PolicyResult], bound: Bound) -> list[PolicyResult]:
    """Each result with its ``gap_to_oracle``: fleet gCO2e per request / the bound's - 1."""
    per_request = bound.fleet_gco2e_per_request
    return [replace(r, gap_to_oracle=r.fleet_gco2e_per_request / per_request - 1.0 if per_request > 0 else math.nan)
            for r in results]
