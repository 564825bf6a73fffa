"""Physical units of scorer quantities, and the exchange rates policies put on them.

A scorer reports a quantity in one unit (``J``, ``gCO2e``, ``ms``, ``USD``, ``miss``: an
expected SLO miss). A policy prices
each quantity with a rate written as ``'<amount> USD/<unit>'``, where the unit may be any
unit of the same dimension: ``'200 USD/tCO2e'`` prices a carbon scorer's grams,
``'0.5 USD/h'`` a latency scorer's milliseconds, ``'0.12 USD/kWh'`` an energy scorer's
joules. A scorer that already reports USD takes a bare number (a multiplier). The rate is
converted once, when the policy is checked, to USD per the scorer's own unit:

    usd_per_scorer_unit = amount / unit.scale x scorer_unit.scale

where ``scale`` is the unit's size in its dimension's base unit (g, J, s, USD, miss).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Unit:
    name: str
    dimension: str
    # Size in the dimension's base unit (g of CO2e, J, s, USD).
    scale: float


UNITS: Mapping[str, Unit] = MappingProxyType({
    u.name: u
    for u in (
        Unit("gCO2e", "mass of CO2e", 1.0),
        Unit("kgCO2e", "mass of CO2e", 1e3),
        Unit("tCO2e", "mass of CO2e", 1e6),
        Unit("J", "energy", 1.0),
        Unit("kJ", "energy", 1e3),
        Unit("Wh", "energy", 3600.0),
        Unit("kWh", "energy", 3.6e6),
        Unit("MWh", "energy", 3.6e9),
        Unit("ms", "time", 1e-3),
        Unit("s", "time", 1.0),
        Unit("min", "time", 60.0),
        Unit("h", "time", 3600.0),
        Unit("USD", "money", 1.0),
        # An expected SLO miss: a count of events (0.01 = a 1 % chance for this request).
        Unit("miss", "SLO misses", 1.0),
    )
})
CURRENCY = "USD"
# An example rate per dimension, for error messages.
EXAMPLE_RATE: Mapping[str, str] = MappingProxyType({
    "mass of CO2e": "'200 USD/tCO2e'",
    "energy": "'0.12 USD/kWh'",
    "time": "'0.5 USD/h'",
    "money": "1 (a multiplier)",
    "SLO misses": "'0.002 USD/miss'",
})

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)\s*USD\s*(?:/\s*([A-Za-z0-9]+))?\s*$")


@dataclass(frozen=True, slots=True)
class Rate:
    """An exchange rate as written: ``amount`` USD per one ``per``."""

    amount: float
    per: Unit

    def __str__(self) -> str:
        return f"{self.amount:g} {CURRENCY}" if self.per.dimension == "money" else f"{self.amount:g} {CURRENCY}/{self.per.name}"

    def of(self, workload_class: str) -> Rate:
        """The rate for ``workload_class``: this one, for every class (as ``ClassRates.of``)."""
        return self

    def usd_per(self, unit: Unit) -> float:
        """The rate in USD per one ``unit`` (which must be of the same dimension; zero prices
        any quantity)."""
        if self.amount == 0:
            return 0.0
        if unit.dimension != self.per.dimension:
            raise ValueError(
                f"a rate per {self.per.name} ({self.per.dimension}) cannot price a quantity in "
                f"{unit.name} ({unit.dimension}); expected a rate like {EXAMPLE_RATE[unit.dimension]}"
            )
        return self.amount / self.per.scale * unit.scale


def parse_rate(value: object) -> Rate:
    """'200 USD/tCO2e', '0.5 USD/h', ... or a bare non-negative number or '<n> USD' (a
    multiplier of a quantity in USD; 0 is zero in any unit)."""
    if isinstance(value, bool):
        raise ValueError(f"expected a rate like '200 USD/tCO2e', got {value!r}")
    if isinstance(value, int | float):
        if not value >= 0:
            raise ValueError(f"a rate must be a non-negative number, got {value!r}")
        return Rate(float(value), UNITS[CURRENCY])
    if not isinstance(value, str) or not (match := _RATE.match(value)):
        raise ValueError(f"expected a rate like '200 USD/tCO2e' or '0.5 USD/h', got {value!r}")
    unit = UNITS.get(match.group(2) or CURRENCY)
    if unit is None:
        raise ValueError(f"unknown unit {match.group(2)!r} in rate {value!r} (known: {', '.join(UNITS)})")
    return Rate(float(match.group(1)), unit)


@dataclass(frozen=True, slots=True)
class ClassRates:
    """A rate per workload class (what a millisecond is worth differs between them)."""

    interactive: Rate
    batch: Rate
    deferrable: Rate

    def of(self, workload_class: str) -> Rate:
        rate: Rate = getattr(self, workload_class)
        return rate

    def __str__(self) -> str:
        return ", ".join(f"{name}: {self.of(name)}" for name in ("interactive", "batch", "deferrable"))
