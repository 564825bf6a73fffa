"""Carbon signals in the shared store (keys and codec per the shared formats).

Latest: ``keys.signal(kind, zone)`` -> ``codec.encode_signal``, kept ``SIGNAL_TTL_S`` (14
days): a signal's staleness is judged from its ``observed_at``, so an old one stays visible as
old.
Forecast: ``keys.forecast("carbon_intensity", zone)`` -> a JSON list of encoded signals, kept
``FORECAST_TTL_S`` (a reader also refuses one older than its policy's ``max_age.forecast``).
Daily maxima: ``keys.signal_daily_max(kind, zone)`` -> ``[[day_start, highest], ...]``, the
highest accepted value of each UTC day over the last ``DAILY_MAX_DAYS`` days, kept as long:
the bound a zone's candidates are priced at while its signal is unusable
(``window_max``). A record that does not decode is logged and treated as missing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon.base import KIND
from scheduler.state import codec, keys
from scheduler.state.store import StateStore
from scheduler.types import Signal
from scheduler.units import DAY_S

log = logging.getLogger(__name__)


# The latest value stays visible as old well past any policy's max age (then its zone is priced
# at its bound); a zone that left every config leaves no key behind for ever.
SIGNAL_TTL_S = 14 * 86400.0


async def write_signal(store: StateStore, signal: Signal) -> None:
    await store.set(keys.signal(signal.kind, signal.key), codec.encode_signal(signal), SIGNAL_TTL_S)


# A forecast key outlives its use by far (readers refuse one older than max_age.forecast);
# the TTL only keeps a zone that left every config from holding one forever.
FORECAST_TTL_S = 2 * 86400.0
DAILY_MAX_DAYS = 14


async def write_forecast(store: StateStore, zone: str, signals: Sequence[Signal]) -> None:
    body = b"[" + b",".join(codec.encode_signal(s) for s in signals) + b"]"
    await store.set(keys.forecast(KIND, zone), body, FORECAST_TTL_S)


def decode_daily_max(raw: bytes | None, key: str) -> list[tuple[float, float]]:
    """``[(day_start, highest), ...]`` of a daily-maxima record ([] when missing or malformed)."""
    if raw is None:
        return []
    try:
        items: Any = json.loads(raw)
        if not isinstance(items, list):
            raise ValueError("not a JSON list")
        days = [(float(day), float(value)) for day, value in items]
    except (ValueError, TypeError) as exc:
        log.warning("store key %s: %s; treating the daily maxima as missing", key, exc)
        return []
    return days


def merge_daily_max(days: Sequence[tuple[float, float]], signal: Signal) -> list[tuple[float, float]]:
    """``days`` with ``signal``'s value folded into its UTC day, the last ``DAILY_MAX_DAYS`` days
    before the newest kept (a bounded record, whatever the feed's rate)."""
    day = signal.observed_at // DAY_S * DAY_S
    merged = dict(days)
    merged[day] = max(merged.get(day, signal.value), signal.value)
    newest = max(merged)
    return sorted((d, v) for d, v in merged.items() if d > newest - DAILY_MAX_DAYS * DAY_S)


def window_max(days: Sequence[tuple[float, float]], now: float, window_s: float) -> float | None:
    """The highest value of the days that overlap ``[now - window_s, now]`` (whole days: at or
    above the window's own maximum, never below it); None when no day does."""
    inside = [value for day, value in days if day + DAY_S > now - window_s and day <= now]
    return max(inside, default=None)


async def record_daily_max(store: StateStore, signal: Signal) -> None:
    """Fold an accepted signal into its zone's daily maxima (the poller that holds the zone's
    lock is the only writer)."""
    key = keys.signal_daily_max(signal.kind, signal.key)
    days = merge_daily_max(decode_daily_max(await store.get(key), key), signal)
    await store.set(key, json.dumps(days, separators=(",", ":")).encode(), DAILY_MAX_DAYS * DAY_S)


def decode_or_none(raw: bytes | None, key: str) -> Signal | None:
    if raw is None:
        return None
    try:
        return codec.decode_signal(raw)
    except ValueError as exc:
        log.warning("store key %s: %s; treating the signal as missing", key, exc)
        return None


async def read_signal(store: StateStore, zone: str, kind: str = KIND) -> Signal | None:
    key = keys.signal(kind, zone)
    return decode_or_none(await store.get(key), key)


async def read_forecast(store: StateStore, zone: str) -> list[Signal]:
    key = keys.forecast(KIND, zone)
    raw = await store.get(key)
    if raw is None:
        return []
    try:
        items = json.loads(raw)
        if not isinstance(items, list):
            raise ValueError("not a JSON list")
        return [codec.decode_signal(json.dumps(item)) for item in items]
    except ValueError as exc:
        log.warning("store key %s: %s; treating the forecast as missing", key, exc)
        return []


async def read_carbon(store: StateStore, regions: Sequence[RegionConfig]) -> dict[str, Signal]:
    """The snapshot's ``carbon`` mapping: grid zone (what the scorer looks up) -> the signal
    polled for the region's carbon source zone (which may be named differently, e.g. a
    WattTime region). One MGET for all regions. Raises ``StateUnavailable``."""
    zones = sorted({r.carbon.zone for r in regions})
    raws = await store.mget([keys.signal(KIND, z) for z in zones])
    by_zone = {z: decode_or_none(raw, keys.signal(KIND, z)) for z, raw in zip(zones, raws, strict=True)}
    carbon: dict[str, Signal] = {}
    for region in regions:
        signal = by_zone[region.carbon.zone]
        if signal is not None:
            carbon[region.grid_zone] = signal
    return carbon


async def list_signals(store: StateStore) -> list[tuple[str, Signal | None]]:
    """Every signal key in the store with its decoded value (None: undecodable)."""
    names = await store.keys("signal:")
    raws = await store.mget(names)
    return [(name, decode_or_none(raw, name)) for name, raw in zip(names, raws, strict=True)]
