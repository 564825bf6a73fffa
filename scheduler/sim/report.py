"""Per-policy results: summary figures, a text table and JSON.

Shares are over all requests of the workload: a request that was unschedulable (no region
passed the hard filters) or failed (every ranked region was down) counts as missing its SLO.
J/request and gCO2e/request are over the requests that ran; J is the GPU energy the simulator
attributed to the request on its pool's true step costs, grams include the region's PUE and
the true grid intensity of the hour it ran in. Fleet idle energy (idle replicas' floor power)
is reported apart, attributed to no request. J per output token is over the requests that
ran, idle energy excluded; ``j_per_output_token_with_idle`` adds the fleet's idle energy:

    j_per_output_token           = sum of their attributed J / sum of their output tokens
    j_per_output_token_with_idle = (sum of their attributed J + idle J) / sum of their output tokens

Prediction error per request that ran, of energy and of TTFT:

    error = (predicted - measured) / measured
    reported: requests, mean (signed), mean of |error|, the 10th, 50th, 90th and 99th
              percentiles of the signed error and the 90th of |error|, in %

``energy_error`` and ``ttft_error`` over every request that ran; ``prediction_error`` the same
per GPU type of the pool the request ran on (``by_gpu``) and per context band of prompt +
output tokens (``by_context``, ``CONTEXT_BANDS``), with ``all`` beside them.

The whole fleet (``fleet_*``): what the fleet's GPUs drew, not only what requests were charged.
Per pool, in facility energy (x the region's PUE) and grams at its region's true hourly
intensity (``scheduler.sim.engine``: idle and cold-start energy booked to the hour it was
drawn in, a request's energy to the hour it was admitted in):

    fleet J      = sum over pools of (charged J + idle J + cold-start J) x PUE
    fleet_kwh    = fleet J / 3.6e6
    fleet gCO2e  = sum over pools and hours of (that hour's J x PUE / 3.6e6 x the hour's g/kWh)
    fleet_gco2e_per_request = fleet gCO2e / requests that ran

``fleet_by_region`` and ``fleet_by_pool`` split the same figures (kWh and grams: charged, idle,
cold start; cold starts; warm replica-hours). ``gco2e_per_request`` stays the per-request
charge (requests' grams alone). ``gap_to_oracle`` (with ``simulate --oracle``):
fleet_gco2e_per_request / the hindsight bound's - 1 (``scheduler.sim.oracle``).

Fallback ages are the signals' true ages at the request's time (``scheduler.sim.engine``).

Deferral (``scheduler.sim.deferral``): when the workload has deferrable requests, ``deferral``
holds the deferrable work's figures (``deferred_gco2e_per_request``, ``missed_deadlines``, ...,
and the same requests decided at arrival, ``deferred_gco2e_per_request_at_arrival``); JSON
puts them at the policy's top level. A held request's TTFT, queue wait and completion time
count from its release.

Workflows (``scheduler.sim.workflow``): ``workflow`` holds the workflows' figures and, after
``scheduler.sim.workflow.merge_affinity``, the same figures with and without affinity
(``j_per_output_token_affinity``, ``j_per_output_token_no_affinity``, ...); JSON puts them at
the policy's top level too.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scheduler.types import Fallback
from scheduler.units import J_PER_KWH

ERROR_PERCENTILES = (10, 50, 90, 99)
# (name, lowest context, highest context + 1) [tokens] of the prediction-error bands.
CONTEXT_BANDS = (("<1k", 0, 1024), ("1k-4k", 1024, 4096), ("4k-8k", 4096, 8192), (">=8k", 8192, 1 << 62))


class FallbackAges:
    """Count, mean and max true age [s] of the signal behind each fallback, per signal."""

    def __init__(self) -> None:
        self.count: Counter[str] = Counter()
        self._aged: Counter[str] = Counter()
        self._sum: dict[str, float] = {}
        self._max: dict[str, float] = {}

    def record(self, fallbacks: Sequence[Fallback], shift_s: float) -> None:
        """``shift_s``: how much older the snapshot's signals are now than at its build."""
        for fallback in fallbacks:
            signal = fallback.signal
            self.count[signal] += 1
            if fallback.age_s is None or not math.isfinite(fallback.age_s):
                continue
            age = fallback.age_s + shift_s
            self._aged[signal] += 1
            self._sum[signal] = self._sum.get(signal, 0.0) + age
            self._max[signal] = max(self._max.get(signal, age), age)

    def merge(self, other: FallbackAges) -> None:
        """Add ``other``'s fallbacks (another shard of the same run) to these."""
        self.count.update(other.count)
        self._aged.update(other._aged)
        for signal, total in other._sum.items():
            self._sum[signal] = self._sum.get(signal, 0.0) + total
        for signal, longest in other._max.items():
            self._max[signal] = max(self._max.get(signal, longest), longest)

    def summary(self) -> dict[str, dict[str, float]]:
        """signal -> count, mean_s and max_s (ages over the fallbacks whose signal was ever seen)."""
        out: dict[str, dict[str, float]] = {}
        for signal in sorted(self.count):
            aged = self._aged[signal]
            out[signal] = {
                "count": self.count[signal],
                "mean_s": self._sum[signal] / aged if aged else math.nan,
                "max_s": self._max[signal] if aged else math.nan,
            }
        return out


def relative_errors(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Requests, mean signed, mean absolute and percentile % errors of predicted vs measured
    (module doc); NaN where no request has both."""
    ok = np.isfinite(predicted) & np.isfinite(measured) & (measured > 0)
    out = {"requests": float(ok.sum())}
    if not ok.any():
        nan = math.nan
        return out | {"mean_pct": nan, "mean_abs_pct": nan, **{f"p{q}_pct": nan for q in ERROR_PERCENTILES},
                      "p90_abs_pct": nan}
    error = (predicted[ok] - measured[ok]) / measured[ok] * 100.0
    magnitude = np.abs(error)
    quantiles = np.percentile(error, ERROR_PERCENTILES)
    return out | {
        "mean_pct": float(error.mean()),
        "mean_abs_pct": float(magnitude.mean()),
        **{f"p{q}_pct": float(v) for q, v in zip(ERROR_PERCENTILES, quantiles, strict=True)},
        "p90_abs_pct": float(np.percentile(magnitude, 90)),
    }


def prediction_errors(predicted_j: np.ndarray, energy_j: np.ndarray, predicted_ttft_s: np.ndarray,
                      ttft_s: np.ndarray, gpu: np.ndarray, context: np.ndarray) -> dict[str, Any]:
    """``relative_errors`` of energy and TTFT over the requests given (those that ran): ``all``,
    ``by_gpu`` (``gpu``: each request's GPU type) and ``by_context`` (``context``: each one's
    prompt + output tokens, ``CONTEXT_BANDS``; empty bands left out)."""

    def group(rows: np.ndarray) -> dict[str, Any]:
        return {"requests": int(rows.sum()),
                "energy": relative_errors(predicted_j[rows], energy_j[rows]),
                "ttft": relative_errors(predicted_ttft_s[rows], ttft_s[rows])}

    every = np.ones(len(energy_j), dtype=bool)
    bands = {name: (context >= low) & (context < high) for name, low, high in CONTEXT_BANDS}
    return {
        "all": group(every),
        "by_gpu": {name: group(gpu == name) for name in sorted(set(gpu.tolist()))},
        "by_context": {name: group(rows) for name, rows in bands.items() if rows.any()},
    }


@dataclass(frozen=True)
class PoolEnergy:
    """What one pool's replicas drew beyond the requests' charge: GPU energy [J] of idle warm
    replicas and of cold starts, and its grams with the region's PUE at each hour's true
    intensity; ``step_j`` every step's energy (what the requests were charged, summed on the
    replicas), ``warm_s`` the replicas' warm time [s]."""

    place: str
    region: str
    pue: float
    idle_j: float
    idle_g: float
    cold_start_j: float
    cold_start_g: float
    cold_starts: int
    step_j: float
    warm_s: float

    def plus(self, other: PoolEnergy) -> PoolEnergy:
        """This pool's figures with another shard's of the same run added."""
        return dataclasses.replace(
            self, idle_j=self.idle_j + other.idle_j, idle_g=self.idle_g + other.idle_g,
            cold_start_j=self.cold_start_j + other.cold_start_j, cold_start_g=self.cold_start_g + other.cold_start_g,
            cold_starts=self.cold_starts + other.cold_starts, step_j=self.step_j + other.step_j,
            warm_s=self.warm_s + other.warm_s)


def fleet_split(pools: Sequence[PoolEnergy], charged_j: np.ndarray, charged_g: np.ndarray
                ) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """(by pool, by region): charged, idle and cold-start kWh (x PUE) and grams, cold starts
    and warm replica-hours; ``charged_j``/``charged_g``: the requests' joules and grams per pool."""

    def figures(pool: PoolEnergy, j: float, g: float) -> dict[str, float]:
        kwh = pool.pue / J_PER_KWH
        return {"charged_kwh": j * kwh, "idle_kwh": pool.idle_j * kwh, "cold_start_kwh": pool.cold_start_j * kwh,
                "kwh": (j + pool.idle_j + pool.cold_start_j) * kwh, "charged_gco2e": g, "idle_gco2e": pool.idle_g,
                "cold_start_gco2e": pool.cold_start_g, "gco2e": g + pool.idle_g + pool.cold_start_g,
                "cold_starts": float(pool.cold_starts), "warm_replica_h": pool.warm_s / 3600.0}

    by_pool = {p.place: figures(p, float(charged_j[i]), float(charged_g[i])) for i, p in enumerate(pools)}
    by_region: dict[str, dict[str, float]] = {}
    for p in pools:
        total = by_region.setdefault(p.region, {})
        for name, value in by_pool[p.place].items():
            total[name] = total.get(name, 0.0) + value
    return by_pool, by_region


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    requests: int
    ran: int
    unschedulable: int
    failed: int
    j_per_request: float
    gco2e_per_request: float
    j_per_output_token: float
    # Output tokens of the requests that ran.
    output_tokens: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    queue_wait_p50_ms: float
    queue_wait_p99_ms: float
    # Arrival to last token, RTT included.
    latency_p50_ms: float
    latency_p99_ms: float
    slo_attainment: float
    violations: int
    region_share: Mapping[str, float]
    fallbacks: Mapping[str, int]
    failovers: int
    queued: int
    prefix_hit_share: float
    unschedulable_by: Mapping[str, int]
    timings_s: Mapping[str, float]
    # "region/pool" -> busy share of its replicas' time (steps running), over the run
    utilisation: Mapping[str, float] = field(default_factory=dict)
    # Energy of idle replicas [J] (floor power), attributed to no request.
    idle_j: float = 0.0
    energy_error: Mapping[str, float] = field(default_factory=dict)
    ttft_error: Mapping[str, float] = field(default_factory=dict)
    # The same per GPU type and per context band (``prediction_errors``).
    prediction_error: Mapping[str, Any] = field(default_factory=dict)
    # signal -> count, mean_s, max_s: true ages of the signals behind the fallbacks
    fallback_age_s: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # Plot inputs (left out of JSON): hour start (epoch s) and requests per hour per region.
    start: float = 0.0
    hourly: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64), repr=False)
    # The deferrable work's figures (empty: the workload has no deferrable request).
    deferral: Mapping[str, Any] = field(default_factory=dict)
    # The workflows' figures (empty: the workload has no workflows).
    workflow: Mapping[str, Any] = field(default_factory=dict)
    # The whole fleet (module doc): kWh with PUE, grams per request that ran, split by region and pool.
    autoscaled: bool = False
    fleet_kwh: float = 0.0
    fleet_gco2e_per_request: float = 0.0
    cold_starts: int = 0
    fleet_by_region: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    fleet_by_pool: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    # fleet_gco2e_per_request / the hindsight bound's - 1 (None: no bound computed)
    gap_to_oracle: float | None = None

    @property
    def j_per_output_token_with_idle(self) -> float:
        return self.j_per_output_token + self.idle_j / self.output_tokens if self.output_tokens else 0.0

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("hourly", "start", "deferral", "workflow")}
        out.update(self.deferral)
        out.update(self.workflow)
        out["region_share"] = dict(self.region_share)
        out["fallbacks"] = dict(self.fallbacks)
        out["unschedulable_by"] = dict(self.unschedulable_by)
        out["timings_s"] = {k: round(v, 3) for k, v in self.timings_s.items()}
        out["utilisation"] = dict(self.utilisation)
        out["energy_error"] = _finite(self.energy_error)
        out["ttft_error"] = _finite(self.ttft_error)
        out["prediction_error"] = _finite_tree(self.prediction_error)
        out["fallback_age_s"] = {k: _finite(v) for k, v in self.fallback_age_s.items()}
        out["fleet_by_region"] = {k: dict(v) for k, v in self.fleet_by_region.items()}
        out["fleet_by_pool"] = {k: dict(v) for k, v in self.fleet_by_pool.items()}
        return out


def _finite(values: Mapping[str, float]) -> dict[str, float | None]:
    """NaN (no data) as None: JSON has no NaN."""
    return {k: v if math.isfinite(v) else None for k, v in values.items()}


def _finite_tree(values: Mapping[str, Any]) -> dict[str, Any]:
    """``_finite`` through nested mappings."""
    return {k: _finite_tree(v) if isinstance(v, Mapping) else (v if not isinstance(v, float) or math.isfinite(v)
                                                                else None)
            for k, v in values.items()}


@dataclass
class RunOutcome:
    """What one simulation run measured, before it is summarised: per request (in workload
    order) and in totals. Shards of one workload (``scheduler.sim.shards``) concatenate theirs."""

    policy: str
    regions: Sequence[str]
    ran_in: np.ndarray
    ttft_s: np.ndarray
    queue_wait_s: np.ndarray
    latency_s: np.ndarray
    budget_s: np.ndarray
    energy_j: np.ndarray
    grams: np.ndarray
    output_tokens: np.ndarray
    prompt_tokens: np.ndarray
    # the pool each request ran in (-1: never ran) and each pool's GPU type
    ran_pool: np.ndarray
    pool_gpus: Sequence[str]
    predicted_j: np.ndarray
    predicted_ttft_s: np.ndarray
    hourly: np.ndarray
    start: float
    counters: Counter[str]
    fallback_ages: FallbackAges
    unschedulable_by: Counter[str]
    # per "region/pool": its replicas' busy time and warm replica time over the run [s]
    busy_s: Mapping[str, float]
    replica_s: Mapping[str, float]
    idle_j: float
    timings_s: Mapping[str, float]
    deferral: Mapping[str, Any] | None = None
    workflow: Mapping[str, Any] | None = None
    # per pool (in ``ran_pool``'s numbering): idle and cold-start energy and grams
    pool_energy: Sequence[PoolEnergy] = ()
    autoscaled: bool = False

    def summary(self) -> PolicyResult:
        utilisation = {place: busy / self.replica_s[place] if self.replica_s[place] > 0 else 0.0
                       for place, busy in self.busy_s.items()}
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                  if f.name not in ("busy_s", "replica_s")}
        return summarize(**fields, utilisation=utilisation)


def summarize(
    *,
    policy: str,
    regions: Sequence[str],
    ran_in: np.ndarray,
    ttft_s: np.ndarray,
    queue_wait_s: np.ndarray,
    latency_s: np.ndarray,
    budget_s: np.ndarray,
    energy_j: np.ndarray,
    grams: np.ndarray,
    output_tokens: np.ndarray,
    prompt_tokens: np.ndarray,
    ran_pool: np.ndarray,
    pool_gpus: Sequence[str],
    predicted_j: np.ndarray,
    predicted_ttft_s: np.ndarray,
    hourly: np.ndarray,
    start: float,
    counters: Counter[str],
    fallback_ages: FallbackAges,
    unschedulable_by: Counter[str],
    utilisation: Mapping[str, float],
    idle_j: float,
    timings_s: Mapping[str, float],
    deferral: Mapping[str, Any] | None = None,
    workflow: Mapping[str, Any] | None = None,
    pool_energy: Sequence[PoolEnergy] = (),
    autoscaled: bool = False,
) -> PolicyResult:
    n = len(ran_in)
    ran = ran_in >= 0
    n_ran = int(ran.sum())
    met = int((ttft_s[ran] <= budget_s[ran]).sum())
    per_region = np.bincount(ran_in[ran], minlength=len(regions))

    def percentile_ms(values: np.ndarray, q: float) -> float:
        return float(np.percentile(values[ran], q)) * 1e3 if n_ran else 0.0

    pools = len(pool_energy)
    charged_j = np.bincount(ran_pool[ran], weights=energy_j[ran], minlength=pools)
    charged_g = np.bincount(ran_pool[ran], weights=grams[ran], minlength=pools)
    by_pool, by_region = fleet_split(pool_energy, charged_j, charged_g)
    fleet_g = sum(f["gco2e"] for f in by_pool.values())
    errors = prediction_errors(predicted_j[ran], energy_j[ran], predicted_ttft_s[ran], ttft_s[ran],
                               np.asarray(pool_gpus, dtype=object)[ran_pool[ran]],
                               prompt_tokens[ran] + output_tokens[ran])

    return PolicyResult(
        policy=policy,
        requests=n,
        ran=n_ran,
        unschedulable=counters["unschedulable"],
        failed=counters["failed"],
        j_per_request=float(energy_j[ran].mean()) if n_ran else 0.0,
        gco2e_per_request=float(grams[ran].mean()) if n_ran else 0.0,
        j_per_output_token=float(energy_j[ran].sum() / output_tokens[ran].sum()) if n_ran else 0.0,
        output_tokens=int(output_tokens[ran].sum()),
        ttft_p50_ms=percentile_ms(ttft_s, 50),
        ttft_p99_ms=percentile_ms(ttft_s, 99),
        queue_wait_p50_ms=percentile_ms(queue_wait_s, 50),
        queue_wait_p99_ms=percentile_ms(queue_wait_s, 99),
        latency_p50_ms=percentile_ms(latency_s, 50),
        latency_p99_ms=percentile_ms(latency_s, 99),
        slo_attainment=met / n if n else 0.0,
        violations=counters["violations"],
        region_share={name: float(per_region[i] / n_ran) if n_ran else 0.0 for i, name in enumerate(regions)},
        fallbacks=dict(sorted(fallback_ages.count.items())),
        failovers=counters["failovers"],
        queued=counters["queued"],
        prefix_hit_share=counters["prefix_hits"] / n_ran if n_ran else 0.0,
        unschedulable_by=dict(sorted(unschedulable_by.items())),
        timings_s=dict(timings_s),
        utilisation=dict(utilisation),
        idle_j=idle_j,
        energy_error=errors["all"]["energy"],
        ttft_error=errors["all"]["ttft"],
        prediction_error=errors,
        fallback_age_s=fallback_ages.summary(),
        start=start,
        hourly=hourly,
        deferral=dict(deferral or {}),
        workflow=dict(workflow or {}),
        autoscaled=autoscaled,
        fleet_kwh=sum(f["kwh"] for f in by_pool.values()),
        fleet_gco2e_per_request=fleet_g / n_ran if n_ran else 0.0,
        cold_starts=sum(p.cold_starts for p in pool_energy),
        fleet_by_region=by_region,
        fleet_by_pool=by_pool,
    )


def format_table(results: Sequence[PolicyResult], baseline: str | None = None) -> str:
    """One row per policy; with ``baseline``, the change in gCO2e/request against it."""
    base = next((r for r in results if r.policy == baseline), None)
    header = (
        f"{'policy':<16}{'requests':>10}{'J/req':>9}{'gCO2e/req':>11}{'vs base':>9}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'SLO met':>9}{'viol.':>7}{'unsched':>9}{'fallbacks':>11}{'failover':>10}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        delta = (
            f"{(r.gco2e_per_request / base.gco2e_per_request - 1) * 100:+.1f}%"
            if base is not None and base.gco2e_per_request > 0
            else "-"
        )
        lines.append(
            f"{r.policy:<16}{r.requests:>10,}{r.j_per_request:>9.1f}{r.gco2e_per_request:>11.4f}{delta:>9}"
            f"{r.ttft_p50_ms:>8.0f}ms{r.ttft_p99_ms:>8.0f}ms{r.slo_attainment * 100:>8.2f}%"
            f"{r.violations:>7}{r.unschedulable:>9}{sum(r.fallbacks.values()):>11}{r.failovers:>10}"
        )
    lines.append("")
    header = (f"{'policy':<16}{'queue p50':>11}{'queue p99':>11}{'done p50':>10}{'done p99':>10}{'idle kWh':>10}"
              f"{'fleet kWh':>11}{'fleet g/req':>13}{'vs base':>9}{'cold starts':>13}{'vs oracle':>11}")
    lines += [header, "-" * len(header)]
    for r in results:
        fleet_delta = (
            f"{(r.fleet_gco2e_per_request / base.fleet_gco2e_per_request - 1) * 100:+.1f}%"
            if base is not None and base.fleet_gco2e_per_request > 0
            else "-"
        )
        gap = "-" if r.gap_to_oracle is None else f"{r.gap_to_oracle * 100:+.1f}%"
        lines.append(
            f"{r.policy:<16}{r.queue_wait_p50_ms:>9.0f}ms{r.queue_wait_p99_ms:>9.0f}ms{r.latency_p50_ms / 1e3:>9.1f}s"
            f"{r.latency_p99_ms / 1e3:>9.1f}s{r.idle_j / 3.6e6:>10.0f}{r.fleet_kwh:>11.1f}"
            f"{r.fleet_gco2e_per_request:>13.5f}{fleet_delta:>9}{r.cold_starts:>13,}{gap:>11}"
        )
    for r in results:
        busy = sorted(((share, pool) for pool, share in r.utilisation.items() if share >= 0.001), reverse=True)
        if busy:
            lines.append(f"{r.policy:<16}busy: " + ", ".join(f"{pool} {share * 100:.1f}%" for share, pool in busy))
        for signal, ages in r.fallback_age_s.items():
            lines.append(
                f"{r.policy:<16}fallback {signal}: {ages['count']:,.0f}, age mean {ages['mean_s'] / 3600:.1f} h, "
                f"max {ages['max_s'] / 3600:.1f} h"
            )
    lines += ["", *_error_table(results)]
    deferring = [r for r in results if r.deferral]
    if deferring:
        lines.append("")
        header = (
            f"{'deferrable work':<16}{'requests':>10}{'held':>9}{'gCO2e/req':>11}{'at arrival':>12}{'change':>9}"
            f"{'J/req':>9}{'at arr.':>9}{'g/kWh':>8}{'at arr.':>9}{'missed':>8}{'at arr.':>9}{'wait p50':>10}"
            f"{'p99':>8}"
        )
        lines += [header, "-" * len(header)]
        for r in deferring:
            d = r.deferral

            def num(key: str, fmt: str, d: Mapping[str, Any] = d) -> str:
                value = d.get(key)
                return "-" if value is None else format(value, fmt)

            wait50, wait99 = (
                "-" if d.get(k) is None else f"{d[k] / 3600:.1f} h" for k in ("deferred_wait_p50_s", "deferred_wait_p99_s")
            )
            lines.append(
                f"{r.policy:<16}{d['deferrable_requests']:>10,}{d['deferred_held']:>9,}"
                f"{num('deferred_gco2e_per_request', '.5f'):>11}{num('deferred_gco2e_per_request_at_arrival', '.5f'):>12}"
                f"{num('deferred_gco2e_change', '+.1%'):>9}{num('deferred_j_per_request', '.1f'):>9}"
                f"{num('deferred_j_per_request_at_arrival', '.1f'):>9}{num('deferred_g_per_kwh', '.1f'):>8}"
                f"{num('deferred_g_per_kwh_at_arrival', '.1f'):>9}{d['missed_deadlines']:>8,}"
                f"{num('missed_deadlines_at_arrival', ','):>9}"
                f"{wait50:>10}{wait99:>8}"
            )
    compared = [r for r in results if "j_per_output_token_no_affinity" in r.workflow]
    if compared:
        lines.append("")
        header = (
            f"{'workflows':<16}{'count':>9}{'J/out tok':>11}{'no aff.':>9}{'ratio':>7}{'hits':>8}{'no aff.':>9}"
            f"{'one pool':>10}{'no aff.':>9}{'TTFT p99':>10}{'no aff.':>9}{'SLO met':>9}{'no aff.':>9}"
        )
        lines += [header, "-" * len(header)]
        for r in compared:
            f = r.workflow
            lines.append(
                f"{r.policy:<16}{f['workflows']:>9,}{f['j_per_output_token_affinity']:>11.3f}"
                f"{f['j_per_output_token_no_affinity']:>9.3f}{f['j_per_output_token_ratio']:>6.2f}x"
                f"{f['prefix_hit_share_affinity'] * 100:>7.1f}%{f['prefix_hit_share_no_affinity'] * 100:>8.1f}%"
                f"{f['workflows_in_one_pool_share_affinity'] * 100:>9.1f}%"
                f"{f['workflows_in_one_pool_share_no_affinity'] * 100:>8.1f}%"
                f"{f['ttft_p99_ms_affinity']:>8.0f}ms{f['ttft_p99_ms_no_affinity']:>7.0f}ms"
                f"{f['slo_attainment_affinity'] * 100:>8.2f}%{f['slo_attainment_no_affinity'] * 100:>8.2f}%"
            )
    regions = list(results[0].region_share) if results else []
    lines.append("")
    lines.append(f"{'region share':<16}" + "".join(f"{name:>14}" for name in regions))
    for r in results:
        lines.append(f"{r.policy:<16}" + "".join(f"{r.region_share[name] * 100:>13.1f}%" for name in regions))
    return "\n".join(lines)


def _error_table(results: Sequence[PolicyResult]) -> list[str]:
    """Prediction error, (predicted - measured) / measured in %, of each policy's requests that
    ran: all, per GPU type, per context band (E: energy, T: TTFT; |E|, |T|: mean absolute)."""
    stats = ("mean_pct", "mean_abs_pct", "p10_pct", "p50_pct", "p90_pct", "p99_pct")
    header = (f"{'prediction error':<17}{'group':<12}{'requests':>10}"
              + "".join(f"{name:>7}" for name in ("E mean", "|E|", "p10", "p50", "p90", "p99"))
              + "".join(f"{name:>7}" for name in ("T mean", "|T|", "p10", "p50", "p90", "p99")))
    lines = [header, "-" * len(header)]
    for r in results:
        errors = r.prediction_error
        if not errors:
            continue
        groups = [("all", errors["all"]), *errors["by_gpu"].items(),
                  *((f"ctx {band}", group) for band, group in errors["by_context"].items())]
        for name, group in groups:
            cells = "".join(
                (f"{group[kind][stat]:>6.0f}%" if stat == "mean_abs_pct" else f"{group[kind][stat]:>+6.0f}%")
                for kind in ("energy", "ttft") for stat in stats
            )
            lines.append(f"{r.policy:<17}{name:<12}{group['requests']:>10,}{cells}")
    return lines


def to_json(results: Sequence[PolicyResult], meta: Mapping[str, Any], oracle: Mapping[str, Any] | None = None) -> str:
    out: dict[str, Any] = {"scenario": dict(meta), "policies": [r.to_json() for r in results]}
    if oracle is not None:
        out["oracle"] = dict(oracle)
    return json.dumps(out, indent=2)
