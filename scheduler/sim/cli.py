"""``scheduler simulate`` (compare policies on a trace) and ``scheduler bench simulate``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.config.args import add_config_dirs
from scheduler.config.loader import ConfigError
from scheduler.config.schema import parse_duration
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, CarbonCsvError
from scheduler.plan.schedule import PlanError, load_schedule
from scheduler.sim.autoscale import AutoscalingSettings
from scheduler.sim.carbon_feed import ProviderOutage
from scheduler.sim.deferral import Deferral
from scheduler.sim.engine import RegionOutage
from scheduler.sim.scenario import ScenarioSpec
from scheduler.sim.truth import TruthModel
from scheduler.sim.workflow_spec import WorkflowSpec
from scheduler.sim.workload import DEFAULT_CONTINENTS, TraceError, WorkloadConfig, with_shares

DEFAULT_POLICIES = "default,latency-first,carbon-first"
TRUTHS = ("model-form", "rated")


def _offset_s(value: str) -> float:
    """A time offset: '0', '90m', '6h', '2d' or seconds."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"expected a non-negative offset, got {value!r}")
    return seconds


@dataclass(frozen=True)
class Window:
    """``NAME@START+DURATION``: START an ISO time (``at``, epoch seconds) or an offset from the
    simulation start (``offset_s``)."""

    name: str
    at: float | None
    offset_s: float
    duration_s: float

    def bounds(self, sim_start: float) -> tuple[float, float]:
        """(start, end) in epoch seconds."""
        start = self.at if self.at is not None else sim_start + self.offset_s
        return start, start + self.duration_s


def _window(value: str) -> Window:
    """'NAME@START+DURATION': START '2023-06-01T06:00Z' (ISO, UTC unless it says), '+6h' or '6h'
    (an offset from the simulation start), DURATION like '6h' or '30m'."""
    try:
        name, rest = value.split("@", 1)
        start, duration = rest.rsplit("+", 1)  # the last '+': an ISO time may carry a '+00:00'
        if not name or not start:
            raise ValueError("a name and a start are needed")
        duration_s = parse_duration(duration)
        if start.startswith("+"):
            return Window(name, None, _offset_s(start[1:]), duration_s)
        try:
            return Window(name, None, _offset_s(start), duration_s)
        except ValueError:
            return Window(name, _iso_time(start), 0.0, duration_s)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"expected NAME@START+DURATION like eu-north@+6h+30m or DE-LU@2023-06-01T06:00Z+6h, got {value!r} ({exc})"
        ) from None


def _iso_time(value: str) -> float:
    """An ISO time ('2023-06-01T06:00Z'; UTC when it names no zone) in epoch seconds."""
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _duration(value: str) -> float:
    try:
        return _offset_s(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _positive_duration(value: str) -> float:
    seconds = _duration(value)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive duration, got {value!r}")
    return seconds


def _shares(value: str) -> dict[str, float]:
    try:
        pairs = (item.split("=", 1) for item in value.split(",") if item)
        return {name.strip(): float(share) for name, share in pairs}
    except ValueError:
        known = ", ".join(c.name for c in DEFAULT_CONTINENTS)
        raise argparse.ArgumentTypeError(f"expected CONTINENT=SHARE,... ({known}), got {value!r}") from None


def _start(value: str) -> float:
    try:
        return _iso_time(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO time like 2023-06-01T00:00Z, got {value!r}") from None


def _share(value: str) -> float:
    share = float(value)
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share in [0, 1], got {value!r}")
    return share


def _non_negative(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = -1.0
    if not number >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return number


def _workflow(value: str) -> WorkflowSpec:
    try:
        return WorkflowSpec.parse(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_scenario_args(parser: argparse.ArgumentParser, hours: float, rate: float | None) -> None:
    add_config_dirs(parser)
    parser.add_argument("--trace", default="conv", help="conv, code (the shipped Azure 2023 traces) or a CSV path")
    parser.add_argument("--hours", type=float, default=hours, help="simulated hours")
    parser.add_argument("--rate", type=float, default=rate,
                        help="mean arrivals per second (default: the trace's own); with --workflow, workflows per second")
    parser.add_argument("--start", type=_start, default=None,
                        help="simulated start time, UTC (default: June 1 of the carbon year)")
    parser.add_argument("--carbon-dir", type=Path, default=SHIPPED_CARBON_DIR,
                        help="folder of hourly Electricity Maps data-portal CSVs (<ZONE>_<YEAR>_hourly.csv)")
    parser.add_argument("--carbon-year", type=int, default=2023)
    parser.add_argument("--carbon-delay", type=_duration, default=0.0, metavar="DURATION",
                        help="publication delay of each hourly value (e.g. 15m)")
    parser.add_argument("--carbon-outage", type=_window, action="append", default=[], metavar="ZONE@START+DURATION",
                        help="ZONE's carbon feed ('*': every zone's) publishes nothing new in that window: the last "
                             "value published before START stays, aging (repeatable); START an ISO time "
                             "(2023-06-01T06:00Z) or an offset from the simulation start (+6h)")
    parser.add_argument("--region-outage", type=_window, action="append", default=[], metavar="REGION@START+DURATION",
                        help="REGION down in that window (repeatable; START as for --carbon-outage)")
    parser.add_argument("--model", default="llama-3.1-8b", help="the model every trace request asks for")
    parser.add_argument("--clients", type=_shares, default=None, metavar="CONTINENT=SHARE,...",
                        help="client shares per continent (default: population shares)")
    parser.add_argument("--residency-share", type=_share, default=0.4,
                        help="share of clients in a jurisdiction (EU) whose requests must stay there")
    parser.add_argument("--batch-share", type=_share, default=0.0)
    parser.add_argument("--deferrable-share", type=_share, default=0.0,
                        help="share of deferrable requests; they wait in the deferral queue for the forecast's "
                             "lowest-carbon window before their deadline")
    parser.add_argument("--deferrable-deadline", type=_positive_duration, default=None, metavar="DURATION",
                        help="a deferrable request's deadline after its arrival, e.g. 6h (default: the policy's "
                             "deferrable TTFT SLO)")
    parser.add_argument("--forecast-error", type=_non_negative, default=Deferral().forecast_error, metavar="SIGMA",
                        help="lognormal sigma of the carbon forecast's error 24 h ahead, growing as sqrt(lead / 24 h) "
                             "(0: perfect foresight)")
    parser.add_argument("--no-deferral", action="store_true",
                        help="decide deferrable requests at arrival (no queue, no second run)")
    parser.add_argument("--prefix-share", type=_share, default=0.3, help="share of requests with a shared prefix")
    parser.add_argument("--workflow", type=_workflow, default=None, metavar="SHAPE:N:TOKENS",
                        help="each trace arrival starts a workflow: chain, fanout or dag of N requests sharing a "
                             "TOKENS-token prefix (e.g. fanout:8:4096); each policy runs with and without affinity")
    parser.add_argument("--capacity-scale", type=float, default=1.0,
                        help="multiply every pool's GPU count (size the fleet to the simulated rate)")
    parser.add_argument("--truth", choices=TRUTHS, default="model-form",
                        help="what the pools and the network really do: model-form (a KV knee past 4,096 tokens, "
                             "each GPU type's energy biased by a held-out residual of the energy model, RTT jitter "
                             "with a tail) or rated (the scheduler's own step model with per-pool noise, the RTT "
                             "as predicted); docs/simulation.md, 'Truth model'")
    parser.add_argument("--truth-error", type=_non_negative, default=None, metavar="SIGMA",
                        help="lognormal sigma of each pool's step costs around its truth, per coefficient group "
                             f"(default {TruthModel().pool_sigma} with model-form, {TruthModel.rated().pool_sigma} "
                             "with rated; 0: none)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1,
                        help="parallel processes: the policies (simulate), time shards of the one policy (bench simulate)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def spec_from_args(args: argparse.Namespace, twelve_regions: bool = False,
                   autoscaling: AutoscalingSettings | None = None) -> ScenarioSpec:
    start = args.start if args.start is not None else datetime(args.carbon_year, 6, 1, tzinfo=UTC).timestamp()
    continents = with_shares(DEFAULT_CONTINENTS, args.clients) if args.clients else DEFAULT_CONTINENTS
    workload = WorkloadConfig(
        start=start,
        hours=args.hours,
        rate=args.rate,
        model=args.model,
        continents=continents,
        residency_share=args.residency_share,
        batch_share=args.batch_share,
        deferrable_share=args.deferrable_share,
        deferrable_deadline_s=args.deferrable_deadline,
        prefix_share=args.prefix_share,
    )
    return ScenarioSpec(
        workload=workload,
        trace=args.trace,
        regions_dir=args.regions,
        policies_dir=args.policies,
        carbon_dir=args.carbon_dir,
        carbon_year=args.carbon_year,
        carbon_delay_s=args.carbon_delay,
        carbon_outages=tuple(
            ProviderOutage(None if w.name == "*" else w.name, *w.bounds(start)) for w in args.carbon_outage
        ),
        region_outages=tuple(RegionOutage(w.name, *w.bounds(start)) for w in args.region_outage),
        capacity_scale=args.capacity_scale,
        truth=truth_from_args(args.truth, args.truth_error),
        twelve_regions=twelve_regions,
        deferral=None if args.no_deferral else Deferral(forecast_error=args.forecast_error),
        workflow=args.workflow,
        autoscaling=autoscaling,
        seed=args.seed,
        progress=not args.no_progress,
    )


def truth_from_args(name: str, sigma: float | None) -> TruthModel:
    """``--truth`` and ``--truth-error`` as a ``TruthModel``."""
    if name == "rated":
        return TruthModel.rated() if sigma is None else TruthModel.rated(sigma)
    return TruthModel() if sigma is None else TruthModel(pool_sigma=sigma)


def register(sub: Any) -> None:
    simulate = sub.add_parser("simulate", help="replay a request trace against the fleet under several policies")
    simulate.add_argument("--compare", default=DEFAULT_POLICIES, help="comma-separated policy names")
    simulate.add_argument("--baseline", default="latency-first", help="policy the gCO2e change is measured against")
    add_scenario_args(simulate, hours=24.0, rate=None)
    simulate.add_argument("--fixed-sizes", action="store_true",
                          help="every pool runs all its replicas throughout (default: each pool scales by Ray "
                               "Serve's autoscaling policy, with cold starts; docs/simulation.md, 'Autoscaling')")
    simulate.add_argument("--min-replicas", type=int, default=None, metavar="N",
                          help="every pool's autoscaling min_replicas (0: pools scale to zero; default: each pool's own, "
                               "its region file's autoscaling block, else 1)")
    simulate.add_argument("--plan", type=Path, default=None, metavar="PLAN.json",
                          help="a capacity plan (`scheduler plan --json`): the pools it names keep its hourly "
                               "min and max replicas as their autoscaler's bounds, by time of day "
                               "(docs/planning.md)")
    simulate.add_argument("--oracle", action="store_true",
                          help="also solve the hindsight bound (an LP of the hour-by-hour placement with the true "
                               "intensities) and report each policy's gap_to_oracle in fleet gCO2e")
    simulate.add_argument("--json", action="store_true", help="print the results as JSON")
    simulate.add_argument("--plots", type=Path, default=None, metavar="DIR", help="write PNG plots to DIR")
    simulate.set_defaults(handler=_simulate)


def register_bench(bench: Any) -> None:
    parser = bench.add_parser("simulate", help="simulator speed: 1M requests, 12 regions, a year of grid data")
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--profile", type=Path, default=None, metavar="FILE", help="write a cProfile dump to FILE")
    add_scenario_args(parser, hours=8760.0, rate=None)
    parser.set_defaults(handler=_bench)

    vs_real = bench.add_parser(
        "sim-vs-real",
        help="replay a small trace through a local vLLM CPU region and through the simulator with step costs "
             "measured on the same engine settings; print TTFT and completion p50/p99 side by side",
    )
    vs_real.add_argument("--trace", default="conv", help="conv, code or a CSV path")
    vs_real.add_argument("--requests", type=int, default=150, help="consecutive trace requests to replay")
    vs_real.add_argument("--rate", type=float, default=6.0, help="mean arrivals per second of the replay")
    vs_real.add_argument("--token-scale", type=float, default=0.25,
                         help="multiply the trace's token counts (the tiny model's context is 2048)")
    vs_real.add_argument("--seed", type=int, default=0)
    vs_real.add_argument("--through", choices=("region", "engine"), default="region",
                         help="replay through a local region (Ray Serve + vLLM, over HTTP; default) or on the "
                              "in-process engine the step costs are calibrated on")
    vs_real.add_argument("--endpoint", help="with --through region: a running region's URL (e.g. "
                                            "http://127.0.0.1:8000/us-east) instead of starting one")
    vs_real.add_argument("--model", help="the model the region is asked for (default: llama-3.1-8b, which the "
                                         "local regions' replicas stand for)")
    vs_real.add_argument("--ticket-keys", type=Path,
                         help="with --endpoint: the ticket key file the region runs with (`scheduler up "
                              "--ticket-keys FILE`); the requests are signed as the router signs them")
    vs_real.add_argument("--quick", action="store_true", help="a small calibration sweep (for tests)")
    vs_real.add_argument("--json", action="store_true", help="print the comparison as JSON")
    vs_real.set_defaults(handler=_sim_vs_real)


def _simulate(args: argparse.Namespace) -> int:
    from scheduler.sim.report import format_table, to_json
    from scheduler.sim.scenario import compare

    policies = [p.strip() for p in args.compare.split(",") if p.strip()]
    try:
        if args.min_replicas is not None and args.min_replicas < 0:
            raise ValueError(f"--min-replicas must be >= 0, got {args.min_replicas}")
        if args.plan is not None and args.fixed_sizes:
            raise ValueError("--plan sets the autoscaler's bounds: it cannot run with --fixed-sizes")
        if args.plan is not None:
            load_schedule(args.plan)  # a bad plan file fails here, naming file, field and value
        spec = dataclasses.replace(
            spec_from_args(args, autoscaling=None if args.fixed_sizes else
                           AutoscalingSettings(min_replicas=args.min_replicas)), plan=args.plan)
        results = compare(spec, policies, args.jobs)
        bound = None
        if args.oracle:
            from scheduler.sim.oracle import solve_bound, with_gaps

            bound = solve_bound(spec)
            results = with_gaps(results, bound)
    except (ConfigError, CarbonCsvError, PlanError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.CONFIG
    except (TraceError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_codes.FAILURE
    if args.json:
        print(to_json(results, spec.describe(), None if bound is None else bound.to_json()))
    else:
        print(format_table(results, args.baseline if args.baseline in policies else None))
        if bound is not None:
            print("\n" + bound.describe())
    if args.plots is not None:
        from scheduler.sim.carbon_feed import CarbonReplay
        from scheduler.sim.plots import write_plots

        regions = spec.regions()
        carbon = CarbonReplay.from_dir(spec.carbon_dir, [r.grid_zone for r in regions], spec.carbon_year)
        for path in write_plots(args.plots, results, regions, carbon):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _sim_vs_real(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib

    import httpx

    from scheduler.sim.vs_real import QUICK_SWEEP, Sweep, compare, trace_requests
    from scheduler.tickets import TicketKeyRing, TicketKeysError

    if args.through == "engine" and (args.endpoint or args.model):
        print("error: --endpoint and --model apply to --through region", file=sys.stderr)
        return 1
    try:
        ticket_keys = TicketKeyRing.load(args.ticket_keys) if args.ticket_keys else None
    except TicketKeysError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        # Checked before the engine starts (20 s): a bad trace or count fails at once.
        trace_requests(args.trace, args.requests, args.rate, args.token_scale, 2048, args.seed)
        # Ray prints its actors' shutdown notices to stdout: this command's stdout is its table or JSON.
        with contextlib.redirect_stdout(sys.stderr):
            comparison = asyncio.run(compare(args.trace, args.requests, args.rate, args.token_scale, args.seed,
                                             QUICK_SWEEP if args.quick else Sweep(), args.through, args.endpoint,
                                             args.model, ticket_keys))
    except (TraceError, ValueError, RuntimeError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(comparison.to_json() if args.json else comparison.table())
    return 0


def _bench(args: argparse.Namespace) -> int:
    import cProfile
    import time

    from scheduler.sim.scenario import run_policy, run_sharded

    args.rate = args.requests / (args.hours * 3600.0)
    args.start = args.start if args.start is not None else datetime(args.carbon_year, 1, 1, tzinfo=UTC).timestamp()
    spec = spec_from_args(args, twelve_regions=True)
    profiler = cProfile.Profile() if args.profile else None
    began = time.perf_counter()
    if profiler is not None:
        profiler.enable()
    try:
        result = run_sharded(spec, args.policy, args.jobs) if args.jobs > 1 else run_policy(spec, args.policy)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(args.profile)
    wall = time.perf_counter() - began
    t = result.timings_s
    rest = t["total"] - t["schedule"] - t["snapshot_and_request"]
    shards = f", {args.jobs} time shards in parallel" if args.jobs > 1 else ""
    print(
        f"simulate: {result.requests:,} requests, 12 regions, {args.hours:.0f} h of hourly grid data, "
        f"policy {args.policy}{shards}: {wall:.1f} s wall ({wall / result.requests * 1e6:.1f} us/request; "
        f"goal <= 45 s)"
    )
    # With shards: CPU seconds summed over them; "the rest" and setup then overlap.
    print(
        f"  Scheduler.schedule {t['schedule']:.1f} s ({t['schedule'] / result.requests * 1e6:.1f} us/decision), "
        f"snapshots + requests {t['snapshot_and_request']:.1f} s"
        + (f", pools/events/accounting {rest:.1f} s, setup {wall - t['total']:.1f} s" if args.jobs <= 1
           else f" (summed over the shards; the longest shard {t['total']:.1f} s)")
    )
    print(
        f"  gCO2e/request {result.gco2e_per_request:.4f}, J/request {result.j_per_request:.1f}, "
        f"SLO met {result.slo_attainment * 100:.2f} %, violations {result.violations}"
    )
    return 0
