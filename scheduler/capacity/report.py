"""A plan as the plan file (``scheduler.plan.schedule.PlanFile``), as a table, and as a plot."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler.capacity.assumptions import Assumptions
from scheduler.capacity.planner import Plan, PlanTotals
from scheduler.plan.schedule import (
    SCHEMA_VERSION,
    DemandSlice,
    PlanFile,
    PoolPlan,
    PoolSlice,
    RegionIntensity,
    SliceFigures,
    Totals,
)


def plan_file(plan: Plan, a: Assumptions, day_start: float, policy: str, trace: str) -> PlanFile:
    slices = len(plan.demand.slices)
    pools = []
    for o in plan.options:
        target = round(a.target_utilisation * o.slots, 1)
        pool_slices = []
        for k, s in enumerate(plan.demand.slices):
            low, high = plan.sizes["planned"][o.key][k]
            figures = {name: SliceFigures(**dataclasses.asdict(e.figures[o.key][k]))
                       for name, e in plan.evaluations.items()}
            pool_slices.append(PoolSlice(start=s.start, min_replicas=low, max_replicas=high,
                                         target_ongoing_requests=target, figures=figures))
        pools.append(PoolPlan(region=o.region.name, pool=o.pool.name, gpu=o.pool.gpu,
                              gpus_per_replica=o.deployment.tensor_parallel, fixed_replicas=o.fixed_replicas,
                              slices=tuple(pool_slices)))
    regions = tuple(
        RegionIntensity(region=r.name, grid_zone=r.grid_zone, pue=r.pue, price_per_kwh=r.price_per_kwh,
                        forecast_g_per_kwh=plan.intensities.forecast[r.name], actual_g_per_kwh=plan.intensities.actual[r.name])
        for r in dict.fromkeys(o.region for o in plan.options)
    )
    demand = tuple(DemandSlice(start=s.start, mean_rps=dict(s.mean_rps), warm_rps=s.total_rps * plan.demand.warm_ratio,
                               peak_rps=s.total_rps * plan.demand.peak_ratio) for s in plan.demand.slices)
    return PlanFile(
        schema_version=SCHEMA_VERSION, day=datetime.fromtimestamp(day_start, tz=UTC).strftime("%Y-%m-%d"),
        start=day_start, slice_s=a.slice_s, slices=slices, model=a.model, policy=policy, trace=trace,
        assumptions=a.describe(), demand=demand, regions=regions, pools=tuple(pools),
        totals={name: Totals(**dataclasses.asdict(e.totals)) for name, e in plan.evaluations.items()},
    )


def table(plan: PlanFile) -> str:
    """The planned warm replicas per pool and hour (pools that keep none all day left out),
    then each plan's totals side by side."""
    lines = [f"plan for {plan.day} (UTC), {plan.model}, policy {plan.policy}, trace {plan.trace}, "
             f"{plan.slices} slices of {plan.slice_s / 3600:g} h"]
    used = [p for p in plan.pools if any(s.max_replicas for s in p.slices)]
    header = "region/pool".ljust(26) + " ".join(f"{datetime.fromtimestamp(s.start, tz=UTC):%H}".rjust(5)
                                                 for s in plan.pools[0].slices)
    lines += ["", "min..max replicas per slice (UTC hour)", header]
    for p in used:
        cells = " ".join(f"{s.min_replicas}..{s.max_replicas}".rjust(5) for s in p.slices)
        lines.append(f"{p.region}/{p.pool}".ljust(26) + cells)
    idle = len(plan.pools) - len(used)
    if idle:
        lines.append(f"({idle} other pools: 0 replicas all day)")
    lines += ["", "per slice, all pools: planned / flat / fixed",
              f"{'UTC':5} {'warm GPUs':>20} {'kWh':>24} {'kgCO2e (forecast)':>26} {'TTFT SLO planned':>17}"]
    for k, s in enumerate(plan.pools[0].slices):
        by_plan = {name: [p.slices[k].figures[name] for p in plan.pools] for name in plan.totals}
        gpus = "/".join(f"{sum(f.min_replicas * p.gpus_per_replica for f, p in zip(figs, plan.pools, strict=True)):,}"
                        for figs in by_plan.values())
        kwh = "/".join(f"{sum(f.energy_j for f in figs) / 3.6e6:,.1f}" for figs in by_plan.values())
        grams = "/".join(f"{sum(f.gco2e for f in figs) / 1000:,.2f}" for figs in by_plan.values())
        planned = by_plan["planned"]
        rate = sum(f.demand_rps for f in planned)
        slo = sum(f.demand_rps * f.slo_attainment for f in planned) / rate if rate else 1.0
        lines.append(f"{datetime.fromtimestamp(s.start, tz=UTC):%H:%M} {gpus:>20} {kwh:>24} {grams:>26} {slo:>17.2%}")
    lines += ["", f"{'plan':8} {'warm GPU-h':>11} {'cold starts':>11} {'kWh':>10} {'kgCO2e fcst':>12} "
                  f"{'kgCO2e true':>12} {'USD':>9} {'J/request':>10} {'TTFT SLO':>9}"]
    for name, t in plan.totals.items():
        lines.append(f"{name:8} {t.warm_gpu_hours:11,.1f} {t.cold_starts:11d} {t.energy_j / 3.6e6:10,.1f} "
                     f"{t.gco2e / 1000:12,.2f} {t.gco2e_actual / 1000:12,.2f} {t.usd:9,.2f} "
                     f"{t.energy_j / t.requests if t.requests else 0:10,.1f} {t.slo_attainment:9.2%}")
    return "\n".join(lines)


def backtest(day: PlanFile, applied: PlanFile, applied_totals: Totals | PlanTotals) -> dict[str, Any]:
    """``applied`` (a plan made for another day) on ``day``, beside ``day``'s own sizings."""
    totals = {f"applied ({applied.day})": _as_dict(applied_totals)}
    totals |= {name: t.model_dump() for name, t in day.totals.items()}
    return {"day": day.day, "applied": applied.day, "model": day.model, "policy": day.policy, "trace": day.trace,
            "totals": totals}


def _as_dict(totals: Totals | PlanTotals) -> dict[str, Any]:
    return totals.model_dump() if isinstance(totals, Totals) else dataclasses.asdict(totals)


def backtest_table(comparison: dict[str, Any]) -> str:
    lines = [f"the plan of {comparison['applied']} applied on {comparison['day']} (UTC time of day), beside "
             f"{comparison['day']}'s own plan ({comparison['model']}, policy {comparison['policy']}, "
             f"trace {comparison['trace']})", "",
             f"{'sizes':20} {'warm GPU-h':>11} {'cold starts':>11} {'kWh':>10} {'kgCO2e true':>12} {'USD':>9} "
             f"{'unserved rps':>12} {'TTFT SLO':>9}"]
    for name, t in comparison["totals"].items():
        lines.append(f"{name:20} {t['warm_gpu_hours']:11,.1f} {t['cold_starts']:11d} {t['energy_j'] / 3.6e6:10,.1f} "
                     f"{t['gco2e_actual'] / 1000:12,.2f} {t['usd']:9,.2f} {t['unserved_rps_max']:12,.2f} "
                     f"{t['slo_attainment']:9.2%}")
    return "\n".join(lines)


def plot(plan: PlanFile, path: Path) -> None:
    """Warm GPUs (planned min_replicas x GPUs per replica) and forecast intensity per region over the day."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Each slice's value holds to the next slice's start; the last one's to the end of the day.
    hours = [(s.start - plan.start) / 3600 for s in plan.pools[0].slices] + [plan.slices * plan.slice_s / 3600]
    fig, (gpus, carbon) = plt.subplots(2, 1, sharex=True, figsize=(10, 7))
    for region in plan.regions:
        warm = [sum(p.slices[k].min_replicas * p.gpus_per_replica for p in plan.pools if p.region == region.region)
                for k in range(plan.slices)]
        gpus.step(hours, [*warm, warm[-1]], where="post", label=region.region)
        carbon.step(hours, [*region.forecast_g_per_kwh, region.forecast_g_per_kwh[-1]], where="post", label=region.region)
    gpus.set_ylabel("warm GPUs (planned min)")
    gpus.set_title(f"scheduler plan {plan.day}: {plan.model}, policy {plan.policy}, trace {plan.trace}")
    gpus.legend(fontsize="small", ncol=4)
    carbon.set_ylabel("forecast intensity (gCO2e/kWh)")
    carbon.set_xlabel("hour of day (UTC)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
