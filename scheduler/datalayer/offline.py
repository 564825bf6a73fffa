"""Snapshot inputs read straight from files, for one-shot tools (``route --explain``,
``bench decide``): carbon signals replayed from the shipped hourly CSVs, and the bounds a
zone's candidates are priced at while its signal is unusable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, ZoneSeries, load_zone, zone_file
from scheduler.types import Signal


def zone_series(regions: Sequence[RegionConfig], carbon_dir: Path = SHIPPED_CARBON_DIR) -> dict[str, ZoneSeries]:
    """Each of the regions' carbon source zones -> its CSV series, each file read once."""
    zones = dict.fromkeys(region.carbon.zone for region in regions)
    return {zone: load_zone(zone_file(carbon_dir, zone), zone) for zone in zones}


def csv_carbon_signals(
    regions: Sequence[RegionConfig], at: float, carbon_dir: Path = SHIPPED_CARBON_DIR, age_s: float | None = None,
    series: Mapping[str, ZoneSeries] | None = None,
) -> dict[str, Signal]:
    """Each region's zone signal at ``at`` (the CSV year replayed at ``at``'s time of year).
    With ``age_s``, the signal is the one observed ``age_s`` before ``at``: as a feed that
    stopped updating then would have left it. ``series``: the zones' series if already read."""
    signals: dict[str, Signal] = {}
    for zone, zone_data in (series or zone_series(regions, carbon_dir)).items():
        signal = zone_data.replay(at if age_s is None else at - age_s)
        if age_s is not None:
            # The exact age asked for, not rounded to the hour the row starts at.
            signal = replace(signal, observed_at=at - age_s, fetched_at=at - age_s)
        signals[zone] = signal
    return signals


def csv_carbon_bounds(
    regions: Sequence[RegionConfig], at: float, window_s: float, carbon_dir: Path = SHIPPED_CARBON_DIR,
    age_s: float | None = None, series: Mapping[str, ZoneSeries] | None = None,
) -> dict[str, float]:
    """Each region's grid zone -> its highest value in the ``window_s`` before ``at`` (before
    ``at - age_s`` with ``age_s``: a feed that stopped then published nothing later), the
    bound its candidates are priced at while its signal is unusable; zones with no row in the
    window are left out (the fleet-wide bound applies). ``series``: as ``csv_carbon_signals``."""
    bounds: dict[str, float] = {}
    end = at if age_s is None else at - age_s
    read = series or zone_series(regions, carbon_dir)
    for region in regions:
        highest = read[region.carbon.zone].highest(end, window_s)
        if highest is not None:
            bounds[region.grid_zone] = highest
    return bounds
