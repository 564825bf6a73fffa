"""``scheduler plan``: warm replicas per region, pool and hour for one day (docs/planning.md)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs
from scheduler.config.loader import ConfigError
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, CarbonCsvError
from scheduler.plan.schedule import PlanFile, schedule_from, warm_replicas_at


def _day(value: str) -> float:
    try:
        day = datetime.strptime(value, "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a day like 2023-06-01, got {value!r}") from None
    return day.timestamp()


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def _sizes_on(applied: PlanFile, day: PlanFile) -> dict[tuple[str, str], tuple[tuple[int, int], ...]]:
    """The applied plan's (min, max) per pool at each slice start of ``day``, by UTC time of day."""
    schedule = schedule_from(applied)
    return {key: tuple(warm_replicas_at(schedule, *key, s.start) for s in day.pools[0].slices)
            for key in schedule.replicas}


def register(sub: Any) -> None:
    parser = sub.add_parser("plan", help="plan warm replicas per region, pool and hour for one day",
                            description=__doc__)
    add_config_dirs(parser)
    parser.add_argument("--trace", default="conv", help="conv, code (the shipped Azure 2023 traces) or a CSV path: "
                                                        "the rate, bursts and token shape of the demand")
    parser.add_argument("--day", type=_day, default=_day("2023-06-01"), metavar="YYYY-MM-DD",
                        help="the UTC day to plan (its carbon data must be in --carbon-dir)")
    parser.add_argument("--demand", type=Path, default=None, metavar="FILE",
                        help="a demand forecast CSV (start,workload_class,mean_rps) instead of the trace's rate")
    parser.add_argument("--assumptions", type=Path, default=None, metavar="FILE",
                        help="planning assumptions YAML (default: the one shipped in scheduler/capacity)")
    parser.add_argument("--policy", default=None, help="the policy whose SLOs and carbon price apply "
                                                       "(default: the assumptions' policy)")
    parser.add_argument("--rate", type=_positive, default=None, help="mean requests/s (default: the assumptions' "
                                                                     "demand.rate, else the trace's own)")
    parser.add_argument("--capacity-scale", type=_positive, default=1.0,
                        help="every pool's GPU count times this (as `simulate --capacity-scale`)")
    parser.add_argument("--carbon-dir", type=Path, default=SHIPPED_CARBON_DIR,
                        help="folder of hourly Electricity Maps CSVs (<ZONE>_<YEAR>_hourly.csv)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the carbon forecast's error")
    parser.add_argument("--json", action="store_true", help="print the plan file (JSON) instead of the table")
    parser.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="write warm GPUs and forecast intensity per region over the day")
    parser.add_argument("--autoscaling-out", type=Path, default=None, metavar="FILE",
                        help="write each pool deployment's autoscaling windows (min_replicas, max_replicas, "
                             "target_ongoing_requests per UTC time window) as YAML")
    parser.add_argument("--apply", type=Path, default=None, metavar="PLAN.json",
                        help="evaluate a plan file made for another day on --day (by UTC time of day), beside "
                             "this day's own plan, flat and fixed sizes")
    parser.set_defaults(handler=_plan)


def _plan(args: argparse.Namespace) -> int:
    import dataclasses

    import yaml

    from scheduler.capacity.assumptions import SHIPPED_ASSUMPTIONS, load_assumptions
    from scheduler.capacity.carbon import day_intensities
    from scheduler.capacity.demand import DemandError, build_demand, client_groups
    from scheduler.capacity.planner import PlanningError, plan_day
    from scheduler.capacity.report import backtest, backtest_table, plan_file, plot, table
    from scheduler.config.loader import load_fleet
    from scheduler.energy.profile_energy_model import ProfileEnergyModel
    from scheduler.plan.schedule import PlanError, autoscaling_document, dump_plan, read_plan
    from scheduler.sim.fleets import scale_fleet
    from scheduler.sim.workload import DEFAULT_CONTINENTS, TraceError, load_trace

    try:
        assumptions = load_assumptions(args.assumptions or SHIPPED_ASSUMPTIONS)
        if args.rate is not None:
            assumptions = dataclasses.replace(assumptions, rate=args.rate)
        fleet = load_fleet(args.regions, args.policies)
        policy_name = args.policy or assumptions.policy
        policy = fleet.policy(policy_name)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.CONFIG
    try:
        regions = scale_fleet(fleet.regions, args.capacity_scale)
        trace = load_trace(args.trace)
        demand = build_demand(trace, assumptions, args.day, args.demand)
        groups = client_groups(DEFAULT_CONTINENTS, assumptions.residency_share)
        intensities = day_intensities(regions, args.day, assumptions, args.carbon_dir, args.seed)
        plan = plan_day(regions, policy, assumptions, demand, groups, intensities, ProfileEnergyModel())
    except (TraceError, DemandError, PlanningError, CarbonCsvError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.FAILURE
    document = plan_file(plan, assumptions, args.day, policy_name, trace.name)
    if args.apply is not None:
        try:
            applied = read_plan(args.apply)
            evaluation = plan.evaluate(_sizes_on(applied, document), assumptions)
        except (PlanError, PlanningError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return exit_codes.FAILURE
        comparison = backtest(document, applied, evaluation.totals)
        print(json.dumps(comparison, indent=2) if args.json else backtest_table(comparison))
        return exit_codes.OK
    print(dump_plan(document) if args.json else table(document))
    if args.plot is not None:
        plot(document, args.plot)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.autoscaling_out is not None:
        header = ("# Ray Serve autoscaling per pool deployment and UTC time window, from `scheduler plan` "
                  "(docs/planning.md).\n")
        args.autoscaling_out.write_text(header + yaml.safe_dump(autoscaling_document(document), sort_keys=False),
                                        encoding="utf-8")
        print(f"wrote {args.autoscaling_out}", file=sys.stderr)
    return exit_codes.OK
