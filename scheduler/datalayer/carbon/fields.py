"""Strict readers for provider JSON: a missing, null or mistyped field raises ``FieldError``
naming its path, so a changed API shape becomes a logged failure, never a made-up value."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from scheduler.datalayer.carbon.errors import FieldError
from scheduler.signal_check import BOUNDS

# Plausible grid carbon intensity, gCO2eq/kWh: the same bound the poller and the scorers check
# (scheduler.signal_check), so a parsed value is never one they would refuse for its size.
MAX_INTENSITY_G_PER_KWH = BOUNDS["carbon_intensity"][1]


def obj(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(f"{where}: expected an object, got {_kind(value)}")
    return value


def array(value: Any, where: str) -> Sequence[Any]:
    if not isinstance(value, list):
        raise FieldError(f"{where}: expected an array, got {_kind(value)}")
    return value


def field(data: Mapping[str, Any], name: str, where: str) -> Any:
    if name not in data:
        raise FieldError(f"{where}.{name}: missing (fields present: {sorted(data)[:12]})")
    return data[name]


def number(data: Mapping[str, Any], name: str, where: str) -> float:
    value = field(data, name, where)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise FieldError(f"{where}.{name}: expected a number, got {value!r}")
    return float(value)


def optional_number(data: Mapping[str, Any], name: str, where: str) -> float | None:
    if data.get(name) is None:
        return None
    return number(data, name, where)


def text(data: Mapping[str, Any], name: str, where: str) -> str:
    value = field(data, name, where)
    if not isinstance(value, str):
        raise FieldError(f"{where}.{name}: expected a string, got {value!r}")
    return value


def optional_text(data: Mapping[str, Any], name: str, where: str) -> str | None:
    if data.get(name) is None:
        return None
    return text(data, name, where)


def boolean(data: Mapping[str, Any], name: str, where: str) -> bool:
    value = field(data, name, where)
    if not isinstance(value, bool):
        raise FieldError(f"{where}.{name}: expected true or false, got {value!r}")
    return value


def timestamp(data: Mapping[str, Any], name: str, where: str) -> float:
    """ISO 8601 with a UTC offset or ``Z`` (``2018-01-20T12:00Z``, ``...T00:00:00.000Z``,
    ``...+00:00``) -> epoch seconds. A time without an offset is ambiguous and rejected."""
    raw = text(data, name, where)
    try:
        parsed = datetime.fromisoformat(raw)
    except ValueError:
        raise FieldError(f"{where}.{name}: expected an ISO 8601 time, got {raw!r}") from None
    if parsed.tzinfo is None:
        raise FieldError(f"{where}.{name}: time {raw!r} has no UTC offset")
    return parsed.timestamp()


def intensity(value: float, where: str) -> float:
    """A gCO2eq/kWh value must be a plausible one; anything else is a unit or data error."""
    if not 0.0 <= value <= MAX_INTENSITY_G_PER_KWH:
        raise FieldError(f"{where}: {value} gCO2eq/kWh is outside 0..{MAX_INTENSITY_G_PER_KWH:.0f}")
    return value


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__
