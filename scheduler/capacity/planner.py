"""The capacity planner: warm replicas per region, pool and time slice for one day.

For each slice k, from the demand D(j, k), the carbon forecast and the pools' replica models
(``pool_model``):

1. **Rank** the pools a client group may use (residency: the group's jurisdiction; the model
   served at or above the policy's precision floor; expected TTFT SLO attainment for the
   group's clients at the target utilisation at least ``slo_target``) by their cost per
   request at the target utilisation, in the policy's own units:

       USD/request = E(B_target) x PUE / 3.6e6 x (price_per_kWh + I_k x carbon_USD_per_kWh_g)

   with I_k the forecast intensity of the slice (gCO2e/kWh) and the carbon price the
   policy's carbon-scorer rate.
2. **Fill** the cheapest pools first, bound groups before the unbound one, up to each pool's
   replicas x per-replica capacity: the warm-quantile rate gives ``min_replicas`` (the
   replicas needed for what each pool took, ceil(rate / capacity)), the peak rate
   ``max_replicas``.
3. **Keep warm** across short dips: where a pool's min_replicas falls and comes back within
   ``keep_warm_lookahead``, it keeps the replicas that come back warm when their idle energy
   over the dip costs less than starting them again (both priced at the forecast).

The day is planned in windows of ``replan_every`` (a rolling horizon): each window's slices
are ranked on the forecast issued at the window's start. Three sizings are then evaluated on
the mean demand, the same way: **planned** (the above), **flat** (each pool's largest planned
size all day) and **fixed** (every replica of the region files warm). Evaluation fills warm
capacity in the same order, and reports per pool and slice the batch, J (requests, idle
replicas, cold starts), gCO2e at the forecast and the true intensity, USD and the expected TTFT
SLO attainment (averaged over the trace's burst levels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.capacity.assumptions import Assumptions
from scheduler.capacity.demand import ClientGroup, Demand
from scheduler.capacity.pool_model import ReplicaModel, cold_start_j, idle_share
from scheduler.config.schema import ModelDeployment, PolicyConfig, PoolConfig, RegionConfig
from scheduler.energy.energy_model import EnergyModel
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE, PRECISION_RANK
from scheduler.framework.network import rtt_row
from scheduler.plan.schedule import PlanName
from scheduler.rates import UNITS
from scheduler.types import GeoPoint
from scheduler.units import J_PER_KWH

CARBON_SCORER = "carbon-scorer"


class PlanningError(ValueError):
    pass


@dataclass(frozen=True)
class Intensities:
    """gCO2e/kWh per region and slice: as forecast when the slice was planned, and true."""

    forecast: Mapping[str, tuple[float, ...]]
    actual: Mapping[str, tuple[float, ...]]


@dataclass(frozen=True)
class PoolOption:
    region: RegionConfig
    pool: PoolConfig
    deployment: ModelDeployment
    replica: ReplicaModel
    slots: int
    capacity_rps: float  # per replica, at the target utilisation
    target_j: float  # E per request at the target utilisation's batch
    cold_start_j: float
    fixed_replicas: int
    # Per client group: round trips to its cities [s] and the cities' weights; absent: the
    # group may not use this pool.
    groups: Mapping[str, tuple[np.ndarray, np.ndarray]]

    @property
    def key(self) -> tuple[str, str]:
        return (self.region.name, self.pool.name)

    def usd_per_j(self, intensity: float, carbon_usd_per_g: float) -> float:
        return self.region.pue / J_PER_KWH * (self.region.price_per_kwh + intensity * carbon_usd_per_g)


@dataclass(frozen=True)
class Figures:
    min_replicas: int
    max_replicas: int
    demand_rps: float
    batch: float
    energy_j: float
    gco2e: float
    gco2e_actual: float
    usd: float
    slo_attainment: float
    cold_starts: int


@dataclass(frozen=True)
class PlanTotals:
    energy_j: float
    gco2e: float
    gco2e_actual: float
    usd: float
    slo_attainment: float
    requests: float
    unserved_rps_max: float
    warm_gpu_hours: float
    cold_starts: int


@dataclass(frozen=True)
class Evaluation:
    figures: Mapping[tuple[str, str], tuple[Figures, ...]]
    totals: PlanTotals


@dataclass(frozen=True)
class Plan:
    options: tuple[PoolOption, ...]
    groups: tuple[ClientGroup, ...]
    demand: Demand
    intensities: Intensities
    # Per pool: (min, max) per slice, for each of planned, flat, fixed.
    sizes: Mapping[PlanName, Mapping[tuple[str, str], tuple[tuple[int, int], ...]]]
    evaluations: Mapping[PlanName, Evaluation]
    carbon_usd_per_g: float
    # Per slice and client group: the pools it may use, cheapest first.
    orders: tuple[tuple[tuple[int, ...], ...], ...]

    def evaluate(self, sizes: Mapping[tuple[str, str], Sequence[tuple[int, int]]], a: Assumptions) -> Evaluation:
        """Other sizes (another day's plan, applied by time of day) on this plan's day: its
        demand, intensities and ranking."""
        missing = sorted(f"{r}/{p}" for r, p in {o.key for o in self.options} - set(sizes))
        if missing:
            raise PlanningError(f"the sizes give no replicas for pool(s) {', '.join(missing)} of this fleet")
        return evaluate(self.options, self.groups, self.orders, self.demand, self.intensities, sizes, a,
                        self.carbon_usd_per_g)


def carbon_price(policy: PolicyConfig, workload_class: str) -> float:
    """USD per gCO2e: the policy's carbon-scorer rate for the class (0 without one)."""
    for term in policy.scorers:
        if term.type == CARBON_SCORER:
            return term.rate_for(workload_class).usd_per(UNITS["gCO2e"])
    return 0.0


def strictest_class(policy: PolicyConfig, a: Assumptions) -> str:
    """The class with demand whose SLO is tightest (smallest TPOT, then TTFT): the plan meets it
    for every request."""
    present = [name for name, share in a.class_shares if share > 0]
    return min(present, key=lambda c: (policy.slo_for(c).tpot_ms, policy.slo_for(c).ttft_ms))


def pool_options(regions: Sequence[RegionConfig], policy: PolicyConfig, a: Assumptions, demand: Demand,
                 groups: Sequence[ClientGroup], energy: EnergyModel) -> tuple[PoolOption, ...]:
    """One option per pool that serves the model at or above the precision floors of the
    classes with demand: the deployment with the least energy per request at the target
    utilisation."""
    klass = strictest_class(policy, a)
    slo = policy.slo_for(klass)
    floors = {str(c): p for c, p in policy.precision_floor.items()}
    floor = max(PRECISION_RANK[floors.get(c, "bf16")] for c, s in a.class_shares if s > 0)
    budget_s = (slo.ttft_ms + slo.ttft_ms_per_1k_prompt_tokens * demand.shape.prompt / 1000.0) / 1000.0
    model = MODEL_CATALOGUE[a.model]
    options = []
    for region in regions:
        for pool in region.pools:
            gpu = GPU_CATALOGUE[pool.gpu]
            best: PoolOption | None = None
            for d in pool.models:
                if d.name != a.model or PRECISION_RANK[d.precision] < floor:
                    continue
                replica = ReplicaModel(energy.rated_costs(model, gpu, d.precision, d.tensor_parallel),
                                       demand.shape, slo.tpot_ms / 1000.0, budget_s)
                slots = replica.slots()
                if slots < 1:
                    continue
                capacity = replica.capacity_rps(slots, a.target_utilisation)
                option = PoolOption(
                    region=region, pool=pool, deployment=d, replica=replica, slots=slots, capacity_rps=capacity,
                    target_j=replica.energy_j(replica.batch_at(capacity, slots)),
                    cold_start_j=cold_start_j(gpu.tdp_w, d.tensor_parallel, a.cold_start_s, a.cold_start_power_share),
                    fixed_replicas=pool.count // d.tensor_parallel,
                    groups=_reachable(region, replica, slots, capacity, groups, a.slo_target),
                )
                if best is None or option.target_j < best.target_j:
                    best = option
            if best is not None:
                options.append(best)
    if not options:
        raise PlanningError(f"no pool serves {a.model} within the {klass} SLO (TPOT {slo.tpot_ms:g} ms) at or "
                            "above the policy's precision floor")
    return tuple(options)


def _reachable(region: RegionConfig, replica: ReplicaModel, slots: int, capacity: float,
               groups: Sequence[ClientGroup], slo_target: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    lat, lon = np.radians([region.location.lat]), np.radians([region.location.lon])
    reachable = {}
    for group in groups:
        if group.jurisdiction is not None and region.jurisdiction != group.jurisdiction:
            continue
        rtt = np.asarray([float(rtt_row(lat, lon, GeoPoint(c_lat, c_lon))[0]) for c_lat, c_lon, _ in group.cities])
        weight = np.asarray([w for _, _, w in group.cities])
        if float(replica.ttft_attainment(np.asarray([capacity]), slots, rtt, weight)[0]) >= slo_target:
            reachable[group.name] = (rtt, weight)
    return reachable


def _order(options: Sequence[PoolOption], group: ClientGroup, k: int, intensities: Intensities,
           carbon_usd_per_g: float) -> list[int]:
    """The pools the group may use, cheapest per request first (ties: region, pool name)."""
    usable = [i for i, o in enumerate(options) if group.name in o.groups]
    return sorted(usable, key=lambda i: (
        options[i].target_j * options[i].usd_per_j(intensities.forecast[options[i].region.name][k], carbon_usd_per_g),
        options[i].key))


def fill(options: Sequence[PoolOption], groups: Sequence[ClientGroup], orders: Sequence[Sequence[int]],
         total_rps: float, replicas: Sequence[int]) -> tuple[np.ndarray, float]:
    """Requests/s per (pool, group) when ``total_rps`` is split over the groups by share and
    each group fills its pools in ``orders`` up to ``replicas`` x capacity; and the rate
    that found no room."""
    room = np.asarray([n * o.capacity_rps for n, o in zip(replicas, options, strict=True)], dtype=float)
    taken = np.zeros((len(options), len(groups)))
    unserved = 0.0
    for g, group in enumerate(groups):
        left = total_rps * group.share
        for i in orders[g]:
            if left <= 0:
                break
            take = min(left, room[i])
            taken[i, g] += take
            room[i] -= take
            left -= take
        unserved += max(0.0, left)
    return taken, unserved


def replicas_for(rate: float, capacity_rps: float) -> int:
    # A rate of exactly k replicas' capacity (give or take float rounding) needs k, not k + 1.
    return math.ceil(rate / capacity_rps - 1e-9) if rate > 0 else 0


def plan_day(regions: Sequence[RegionConfig], policy: PolicyConfig, a: Assumptions, demand: Demand,
             groups: Sequence[ClientGroup], intensities: Intensities, energy: EnergyModel) -> Plan:
    options = pool_options(regions, policy, a, demand, groups, energy)
    carbon_usd_per_g = carbon_price(policy, strictest_class(policy, a))
    slices = len(demand.slices)
    orders = tuple(tuple(tuple(_order(options, g, k, intensities, carbon_usd_per_g)) for g in groups)
                   for k in range(slices))
    fixed = [o.fixed_replicas for o in options]
    low = np.zeros((len(options), slices), dtype=np.int64)
    high = np.zeros((len(options), slices), dtype=np.int64)
    for k, s in enumerate(demand.slices):
        warm, _ = fill(options, groups, orders[k], s.total_rps * demand.warm_ratio, fixed)
        peak, _ = fill(options, groups, orders[k], s.total_rps * demand.peak_ratio, fixed)
        for i, o in enumerate(options):
            low[i, k] = min(o.fixed_replicas, max(a.min_replicas_per_pool, replicas_for(warm[i].sum(), o.capacity_rps)))
            high[i, k] = min(o.fixed_replicas, max(low[i, k], replicas_for(peak[i].sum(), o.capacity_rps)))
    for i, o in enumerate(options):
        keep_warm(low[i], o, intensities.forecast[o.region.name], carbon_usd_per_g, a)
    high = np.maximum(high, low)
    sizes: dict[PlanName, dict[tuple[str, str], tuple[tuple[int, int], ...]]] = {
        "planned": {o.key: tuple((int(low[i, k]), int(high[i, k])) for k in range(slices)) for i, o in enumerate(options)},
        "flat": {o.key: ((int(low[i].max()), int(high[i].max())),) * slices for i, o in enumerate(options)},
        "fixed": {o.key: ((o.fixed_replicas, o.fixed_replicas),) * slices for o in options},
    }
    evaluations = {name: evaluate(options, groups, orders, demand, intensities, sized, a, carbon_usd_per_g)
                   for name, sized in sizes.items()}
    return Plan(tuple(options), tuple(groups), demand, intensities, sizes, evaluations, carbon_usd_per_g, orders)


def keep_warm(low: np.ndarray, option: PoolOption, forecast: Sequence[float], carbon_usd_per_g: float,
              a: Assumptions) -> None:
    """Raise ``low`` in place through dips of at most ``keep_warm_lookahead`` where idling the
    replicas that come back costs less than cold-starting them (module doc, step 3)."""
    lookahead = int(a.keep_warm_lookahead_s // a.slice_s)
    idle_j = option.replica.idle_w * a.slice_s  # one replica idle for one slice (an upper bound)
    for k in range(1, len(low)):
        before = int(low[k - 1])
        if low[k] >= before:
            continue
        comeback = next((j for j in range(k + 1, min(len(low), k + 1 + lookahead)) if low[j] > low[k]), None)
        if comeback is None:
            continue
        kept = min(before, int(low[comeback])) - int(low[k])
        idle_usd = sum(kept * idle_j * option.usd_per_j(forecast[j], carbon_usd_per_g) for j in range(k, comeback))
        restart_usd = kept * option.cold_start_j * option.usd_per_j(forecast[comeback], carbon_usd_per_g)
        if idle_usd <= restart_usd:
            low[k:comeback] = np.maximum(low[k:comeback], int(low[k]) + kept)


def evaluate(options: Sequence[PoolOption], groups: Sequence[ClientGroup], orders: Sequence[Sequence[Sequence[int]]],
             demand: Demand, intensities: Intensities, sizes: Mapping[tuple[str, str], Sequence[tuple[int, int]]],
             a: Assumptions, carbon_usd_per_g: float) -> Evaluation:
    """The sizing under the mean demand of each slice, warm replicas filled in rank order."""
    levels = np.asarray(demand.levels)
    slices = len(demand.slices)
    per_pool: dict[tuple[str, str], list[Figures]] = {o.key: [] for o in options}
    served_within = total_requests = energy = grams = grams_actual = usd = gpu_hours = 0.0
    unserved_max = 0.0
    starts = 0
    for k, s in enumerate(demand.slices):
        warm = [sizes[o.key][k][0] for o in options]
        # As planned: each pool takes its share at the warm quantile of the bursts within its
        # target utilisation, so the mean is that share over the burst ratio.
        taken, unserved = fill(options, groups, orders[k], s.total_rps * demand.warm_ratio, warm)
        taken, unserved = taken / demand.warm_ratio, unserved / demand.warm_ratio
        unserved_max = max(unserved_max, unserved)
        total_requests += s.total_rps * a.slice_s
        for i, o in enumerate(options):
            n, n_max = sizes[o.key][k]
            started = max(0, n - sizes[o.key][k - 1][0]) if slices > 1 else 0  # the day repeats: slice 0 follows the last
            rate = float(taken[i].sum())
            batch, request_j, idle = 0.0, 0.0, 0.0
            attainment = 1.0
            if n > 0:
                per_replica = rate / n
                batch = o.replica.batch_at(per_replica, o.slots)
                request_j = o.replica.energy_j(batch) if rate > 0 else 0.0
                idle = n * o.replica.idle_w * idle_share(per_replica, o.replica.occupancy_s(batch)) * a.slice_s
            if rate > 0:
                attainment = _attainment(o, groups, taken[i], rate / n, levels)
            joules = rate * a.slice_s * request_j + idle + started * o.cold_start_j
            kwh_at_meter = joules * o.region.pue / J_PER_KWH
            figures = Figures(
                min_replicas=n, max_replicas=n_max, demand_rps=rate, batch=batch, energy_j=joules,
                gco2e=kwh_at_meter * intensities.forecast[o.region.name][k],
                gco2e_actual=kwh_at_meter * intensities.actual[o.region.name][k],
                usd=kwh_at_meter * o.region.price_per_kwh, slo_attainment=attainment, cold_starts=started,
            )
            per_pool[o.key].append(figures)
            served_within += rate * a.slice_s * attainment
            energy += joules
            grams += figures.gco2e
            grams_actual += figures.gco2e_actual
            usd += figures.usd
            gpu_hours += n * o.deployment.tensor_parallel * a.slice_s / 3600.0
            starts += started
    totals = PlanTotals(energy, grams, grams_actual, usd, served_within / total_requests if total_requests else 1.0,
                        total_requests, unserved_max, gpu_hours, starts)
    return Evaluation({key: tuple(f) for key, f in per_pool.items()}, totals)


def _attainment(option: PoolOption, groups: Sequence[ClientGroup], taken: np.ndarray, per_replica_rps: float,
                levels: np.ndarray) -> float:
    """Traffic-weighted TTFT SLO attainment over the burst levels and the groups the pool serves."""
    rates = per_replica_rps * levels
    total = 0.0
    for g, group in enumerate(groups):
        if taken[g] <= 0:
            continue
        rtt, weight = option.groups[group.name]
        by_level = option.replica.ttft_attainment(rates, option.slots, rtt, weight)
        total += taken[g] * float((by_level * levels).sum() / levels.sum())
    return total / float(taken.sum())
