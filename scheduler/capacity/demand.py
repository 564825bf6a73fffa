"""Demand D(j, k): requests/s per workload class j and time slice k, with the bursts inside a
slice, the token shape of a request, and the client groups the demand comes from.

From a trace (the shipped Azure traces or a CSV in their format, ``scheduler.sim.workload``):

    D(j, k) = rate x hourly_profile[UTC hour of slice k] x share_j

where rate is the assumptions' ``demand.rate`` or the trace's own mean rate. The trace is cut
into ``burst_window``s; each window's rate over the trace's mean is one burst ratio, and the
plan sizes warm replicas for the ``warm_quantile`` of those ratios and the most replicas for
the ``max_quantile`` x ``max_headroom``. From a demand forecast file (``--demand FILE``: CSV
``start,workload_class,mean_rps``, one row per slice start (UTC, ISO) and class), D(j, k) is
the file's, by UTC time of day; the bursts and the token shape still come from the trace.

Clients sit where ``scheduler simulate`` puts them (continent shares of world population,
``scheduler.sim.workload.DEFAULT_CONTINENTS``); in a continent with a jurisdiction,
``residency_share`` of the clients are bound to it. Each bound jurisdiction is one group, the
unbound clients another.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from scheduler.capacity.assumptions import Assumptions
from scheduler.config.schema import WORKLOAD_CLASS_NAMES
from scheduler.sim.workload import Continent, Trace
from scheduler.units import DAY_S

# Burst ratios kept per plan: the quantiles at these many evenly spaced levels (SLO
# attainment is averaged over them; the trace's 60 one-minute windows need no more).
BURST_LEVELS = 24


class DemandError(ValueError):
    pass


@dataclass(frozen=True)
class TokenShape:
    """Means over the trace's requests of the features a request's energy and time are linear
    in (``scheduler.energy.step``; no prefix-cache hits assumed)."""

    prompt: float  # P
    prefill_pairs: float  # P^2 / 2: causal attention pairs of an uncached prefill
    decode_steps: float  # N - 1
    decode_context: float  # (N - 1) (P + N / 2): KV tokens read over the decode steps
    reservation: float  # P + N: the KV tokens a running request holds (vLLM reserves them)
    context: float  # P + N / 2: a running sequence's mean context


def token_shape(trace: Trace) -> TokenShape:
    p = trace.prompt_tokens.astype(float)
    n = trace.output_tokens.astype(float)
    return TokenShape(
        prompt=float(p.mean()),
        prefill_pairs=float((p * p / 2.0).mean()),
        decode_steps=float((n - 1.0).mean()),
        decode_context=float(((n - 1.0) * (p + n / 2.0)).mean()),
        reservation=float((p + n).mean()),
        context=float((p + n / 2.0).mean()),
    )


def burst_ratios(trace: Trace, window_s: float) -> np.ndarray:
    """Each whole window's request rate over the trace's mean rate, ascending."""
    windows = int(trace.span_s // window_s)
    if windows < 2:
        raise DemandError(f"trace {trace.name}: its {trace.span_s:.0f} s hold fewer than two "
                          f"demand.burst_window of {window_s:g} s")
    counts = np.bincount((trace.offsets_s // window_s).astype(np.int64), minlength=windows)[:windows]
    ratios: np.ndarray = np.sort(counts / (trace.native_rate * window_s))
    return ratios


def burst_levels(ratios: np.ndarray) -> np.ndarray:
    """``BURST_LEVELS`` quantiles of the ratios at the midpoints of equal probability bands:
    each stands for an equal share of the windows."""
    levels: np.ndarray = np.quantile(ratios, (np.arange(BURST_LEVELS) + 0.5) / BURST_LEVELS)
    return levels


@dataclass(frozen=True)
class DemandSlice:
    start: float
    mean_rps: Mapping[str, float]  # per workload class

    @property
    def total_rps(self) -> float:
        return sum(self.mean_rps.values())


@dataclass(frozen=True)
class Demand:
    slices: tuple[DemandSlice, ...]
    # Window rate / mean rate at the quantiles that size min and max replicas, and the
    # ``BURST_LEVELS`` levels SLO attainment is averaged over.
    warm_ratio: float
    peak_ratio: float
    levels: tuple[float, ...]
    shape: TokenShape


def from_trace(trace: Trace, a: Assumptions, day_start: float) -> tuple[DemandSlice, ...]:
    rate = a.rate if a.rate is not None else trace.native_rate
    slices = []
    for k in range(a.slices):
        start = day_start + k * a.slice_s
        hour = datetime.fromtimestamp(start, tz=UTC).hour
        mean = rate * a.hourly_profile[hour]
        slices.append(DemandSlice(start, {name: mean * share for name, share in a.class_shares}))
    return tuple(slices)


def from_forecast_file(path: Path, a: Assumptions, day_start: float) -> tuple[DemandSlice, ...]:
    """``start,workload_class,mean_rps`` rows; every slice of the day needs a row per class
    with a positive share (a missing one is an error, not a zero)."""
    found: dict[tuple[int, str], float] = {}
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            wanted = {"start", "workload_class", "mean_rps"}
            if reader.fieldnames is None or not wanted.issubset(reader.fieldnames):
                raise DemandError(f"{path}: expected columns {sorted(wanted)}, got {reader.fieldnames}")
            for line, row in enumerate(reader, start=2):
                klass = row["workload_class"]
                if klass not in WORKLOAD_CLASS_NAMES:
                    raise DemandError(f"{path}:{line}: workload_class: {klass!r} is not one of {WORKLOAD_CLASS_NAMES}")
                try:
                    start = datetime.fromisoformat(row["start"].replace("Z", "+00:00"))
                    rps = float(row["mean_rps"])
                except ValueError as exc:
                    raise DemandError(f"{path}:{line}: {exc}") from None
                if start.tzinfo is None:
                    start = start.replace(tzinfo=UTC)
                if not rps >= 0:
                    raise DemandError(f"{path}:{line}: mean_rps: expected a rate >= 0, got {row['mean_rps']!r}")
                offset = (start.timestamp() - day_start) % DAY_S
                k = round(offset / a.slice_s)
                if abs(offset - k * a.slice_s) > 1e-6:
                    raise DemandError(f"{path}:{line}: start: {row['start']!r} is not on a slice boundary "
                                      f"({a.slice_s:g} s slices)")
                found[(k % a.slices, klass)] = rps
    except OSError as exc:
        raise DemandError(f"{path}: cannot read: {exc.strerror}") from None
    needed = [name for name, share in a.class_shares if share > 0] or list(WORKLOAD_CLASS_NAMES[:1])
    missing = [(k, c) for k in range(a.slices) for c in needed if (k, c) not in found]
    if missing:
        k, c = missing[0]
        raise DemandError(f"{path}: no row for slice {k} ({k * a.slice_s / 3600:g} h UTC), class {c} "
                          f"({len(missing)} missing)")
    return tuple(
        DemandSlice(day_start + k * a.slice_s, {c: found.get((k, c), 0.0) for c in WORKLOAD_CLASS_NAMES})
        for k in range(a.slices)
    )


def build_demand(trace: Trace, a: Assumptions, day_start: float, forecast: Path | None = None) -> Demand:
    ratios = burst_ratios(trace, a.burst_window_s)
    slices = from_trace(trace, a, day_start) if forecast is None else from_forecast_file(forecast, a, day_start)
    return Demand(
        slices=slices,
        warm_ratio=float(np.quantile(ratios, a.warm_quantile)),
        peak_ratio=float(np.quantile(ratios, a.max_quantile)) * a.max_headroom,
        levels=tuple(float(x) for x in burst_levels(ratios)),
        shape=token_shape(trace),
    )


@dataclass(frozen=True)
class ClientGroup:
    """Clients that share a residency rule: their share of demand, where they sit (lat, lon,
    weight within the group), the jurisdiction they must stay in (None: anywhere)."""

    name: str
    share: float
    cities: tuple[tuple[float, float, float], ...]
    jurisdiction: str | None


def client_groups(continents: Sequence[Continent], residency_share: float) -> tuple[ClientGroup, ...]:
    """Bound groups first (they have fewer places to go), then the unbound clients."""
    total = sum(c.share for c in continents)
    bound: dict[str, list[tuple[float, float, float]]] = {}
    free: list[tuple[float, float, float]] = []
    for continent in continents:
        per_city = continent.share / total / len(continent.cities)
        for city in continent.cities:
            if continent.jurisdiction is None:
                free.append((city.lat, city.lon, per_city))
            else:
                bound.setdefault(continent.jurisdiction, []).append((city.lat, city.lon, per_city * residency_share))
                free.append((city.lat, city.lon, per_city * (1.0 - residency_share)))
    groups = [_group(f"bound-{j}", cities, j) for j, cities in sorted(bound.items())]
    groups.append(_group("unbound", free, None))
    return tuple(g for g in groups if g.share > 0)


def _group(name: str, cities: list[tuple[float, float, float]], jurisdiction: str | None) -> ClientGroup:
    share = sum(w for _, _, w in cities)
    normalised = tuple((lat, lon, w / share) for lat, lon, w in cities) if share > 0 else ()
    return ClientGroup(name, share, normalised, jurisdiction)
