"""Per-policy results: summary figures, a text table and JSON.

Shares are over all requests of the workload: a request that was unschedulable (no region
passed the hard filters) or failed (every ranked region was down) counts as missing its SLO.
J/request and gCO2e/request are over the requests that ran; J is GPU energy (the energy
model), grams include the region's PUE and the true grid intensity of the hour it ran in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    requests: int
    ran: int
    unschedulable: int
    failed: int
    j_per_request: float
    gco2e_per_request: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    slo_attainment: float
    violations: int
    region_share: Mapping[str, float]
    fallbacks: Mapping[str, int]
    failovers: int
    queued: int
    prefix_hit_share: float
    unschedulable_by: Mapping[str, int]
    timings_s: Mapping[str, float]
    # Plot inputs (left out of JSON): hour start (epoch s) and requests per hour per region.
    start: float = 0.0
    hourly: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64), repr=False)

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("hourly", "start")}
        out["region_share"] = dict(self.region_share)
        out["fallbacks"] = dict(self.fallbacks)
        out["unschedulable_by"] = dict(self.unschedulable_by)
        out["timings_s"] = {k: round(v, 3) for k, v in self.timings_s.items()}
        return out


def summarize(
    *,
    policy: str,
    regions: Sequence[str],
    ran_in: np.ndarray,
    ttft_s: np.ndarray,
    budget_s: np.ndarray,
    energy_j: np.ndarray,
    grams: np.ndarray,
    hourly: np.ndarray,
    start: float,
    counters: Counter[str],
    fallbacks: Counter[str],
    unschedulable_by: Counter[str],
    timings_s: Mapping[str, float],
) -> PolicyResult:
    n = len(ran_in)
    ran = ran_in >= 0
    n_ran = int(ran.sum())
    met = int((ttft_s[ran] <= budget_s[ran]).sum())
    per_region = np.bincount(ran_in[ran], minlength=len(regions))
    ran_ttft_ms = ttft_s[ran] * 1e3
    return PolicyResult(
        policy=policy,
        requests=n,
        ran=n_ran,
        unschedulable=counters["unschedulable"],
        failed=counters["failed"],
        j_per_request=float(energy_j[ran].mean()) if n_ran else 0.0,
        gco2e_per_request=float(grams[ran].mean()) if n_ran else 0.0,
        ttft_p50_ms=float(np.percentile(ran_ttft_ms, 50)) if n_ran else 0.0,
        ttft_p99_ms=float(np.percentile(ran_ttft_ms, 99)) if n_ran else 0.0,
        slo_attainment=met / n if n else 0.0,
        violations=counters["violations"],
        region_share={name: float(per_region[i] / n_ran) if n_ran else 0.0 for i, name in enumerate(regions)},
        fallbacks=dict(sorted(fallbacks.items())),
        failovers=counters["failovers"],
        queued=counters["queued"],
        prefix_hit_share=counters["prefix_hits"] / n_ran if n_ran else 0.0,
        unschedulable_by=dict(sorted(unschedulable_by.items())),
        timings_s=dict(timings_s),
        start=start,
        hourly=hourly,
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
    regions = list(results[0].region_share) if results else []
    lines.append("")
    lines.append(f"{'region share':<16}" + "".join(f"{name:>14}" for name in regions))
    for r in results:
        lines.append(f"{r.policy:<16}" + "".join(f"{r.region_share[name] * 100:>13.1f}%" for name in regions))
    return "\n".join(lines)


def to_json(results: Sequence[PolicyResult], meta: Mapping[str, Any]) -> str:
    return json.dumps({"scenario": dict(meta), "policies": [r.to_json() for r in results]}, indent=2)
