"""PNG plots of a comparison (matplotlib, Agg backend: no display needed).

- grid_intensity.png: the true hourly intensity of each region's grid zone over the run;
- region_share.png:   each region's share of requests per hour, one panel per policy;
- policies.png:       gCO2e/request, J/request, TTFT p99 and SLO attainment side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from scheduler.config.schema import RegionConfig
from scheduler.sim.carbon_feed import CarbonReplay
from scheduler.sim.report import PolicyResult


def write_plots(
    directory: Path, results: Sequence[PolicyResult], regions: Sequence[RegionConfig], carbon: CarbonReplay
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    start = results[0].start if results else 0.0
    hours = max((r.hourly.shape[0] for r in results), default=1)
    times = np.asarray([datetime.fromtimestamp(start + 3600 * h, UTC).replace(tzinfo=None) for h in range(hours + 1)],
                       dtype="datetime64[s]")

    fig, ax = plt.subplots(figsize=(11, 4.5))
    for region in regions:
        values = [carbon.intensity(region.grid_zone, start + 3600 * h + 1800) for h in range(hours)]
        ax.plot(times[:hours], values, label=f"{region.name} ({region.grid_zone})", linewidth=1.2)
    ax.set_ylabel("gCO2e/kWh (LCA)")
    ax.set_title("Grid carbon intensity over the simulated period")
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.autofmt_xdate()
    fig.tight_layout()
    written.append(_save(fig, directory / "grid_intensity.png", plt))

    names = [r.name for r in regions]
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 2.6 * len(results)), sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results, strict=True):
        counts = result.hourly.astype(float)
        totals = counts.sum(axis=1, keepdims=True)
        shares = np.divide(counts, totals, out=np.zeros_like(counts), where=totals > 0)
        # one step per hour, closed at the end of the last hour
        ax.stackplot(times[: len(shares) + 1], np.vstack([shares, shares[-1:]]).T, labels=names, step="post")
        ax.set_ylim(0, 1)
        ax.set_ylabel("share")
        ax.set_title(f"{result.policy}: region share of requests per hour", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=1, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.autofmt_xdate()
    fig.tight_layout()
    written.append(_save(fig, directory / "region_share.png", plt))

    metrics = (
        ("gCO2e / request", [r.gco2e_per_request for r in results]),
        ("J / request", [r.j_per_request for r in results]),
        ("TTFT p99 (ms)", [r.ttft_p99_ms for r in results]),
        ("TTFT SLO met (%)", [r.slo_attainment * 100 for r in results]),
    )
    fig, axes = plt.subplots(1, len(metrics), figsize=(13, 3.6), squeeze=False)
    labels = [r.policy for r in results]
    for ax, (title, values) in zip(axes[0], metrics, strict=True):
        ax.bar(labels, values, color=plt.cm.tab10(np.arange(len(labels))))
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelrotation=30, labelsize=8)
    fig.tight_layout()
    written.append(_save(fig, directory / "policies.png", plt))
    return written


def _save(fig: object, path: Path, plt: object) -> Path:
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[attr-defined]
    return path
