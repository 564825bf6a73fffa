"""Carbon signals in the shared store (keys and codec per the shared formats).

Latest: ``keys.signal(kind, zone)`` -> ``codec.encode_signal``. Forecast:
``keys.forecast("carbon_intensity", zone)`` -> a JSON list of encoded signals. No TTL: a
signal's staleness is judged from its ``observed_at``, so an old one stays visible as old.
A record that does not decode is logged and treated as missing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from scheduler.config.schema import RegionConfig
from scheduler.datalayer.carbon.base import KIND
from scheduler.state import codec, keys
from scheduler.state.store import StateStore
from scheduler.types import Signal

log = logging.getLogger(__name__)


async def write_signal(store: StateStore, signal: Signal) -> None:
    await store.set(keys.signal(signal.kind, signal.key), codec.encode_signal(signal))


async def write_forecast(store: StateStore, zone: str, signals: Sequence[Signal]) -> None:
    body = b"[" + b",".join(codec.encode_signal(s) for s in signals) + b"]"
    await store.set(keys.forecast(KIND, zone), body)


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
