"""UK Carbon Intensity API (National Energy System Operator): Great Britain's national grid
intensity in gCO2/kWh, per half hour, no key.

Requests and responses (carbon-intensity.github.io/api-definitions, "Carbon Intensity -
National"): ``GET /intensity`` (the current half hour), ``GET /intensity/{from}/fw24h`` (24 h
forward from ``from``), ``GET /intensity/{from}/pt24h`` (24 h back); ``from`` is ISO 8601
``YYYY-MM-DDThh:mmZ``. Each answers ``{"data": [{"from": "2018-01-20T12:00Z", "to":
"2018-01-20T12:30Z", "intensity": {"forecast": 266, "actual": 263, "index": "moderate"}}]}``.
``actual`` is null for a half hour not yet settled (the current one, and every future one):
then the value is the ``forecast``, and the signal says so (``is_forecast``, ``is_estimated``).
``from`` (the start of the half hour) is ``observed_at``. As served, ``/intensity`` answers
with the latest *complete* half hour (at 12:10 the slot 11:30-12:00), so its ``from`` is up to an
hour old; and ``/intensity/{from}/fw24h`` starts with the slot that *ends* at ``from`` (already
past). The latest signal is dated by its slot's ``from``, whichever slot that is, and the
forecast keeps only the slots that have not ended by the time of the fetch. Errors: ``{"error": {"code": "400
Bad Request", "message": ...}}``. The API covers the national zone ``GB`` only here (its
regional endpoints are forecast-only and keyed by region id, not grid zone).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scheduler.datalayer.carbon import fields as f
from scheduler.datalayer.carbon.base import KIND, NO_SKIP, UNIT, Fetched, fetch_parts, parsing
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock, JsonHttp
from scheduler.types import Signal

NAME = "ukci"
DEFAULT_BASE_URL = "https://api.carbonintensity.org.uk"
ZONES = frozenset({"GB"})
INTENSITY = "/intensity"


def period_signal(period: Mapping[str, Any], zone: str, endpoint: str, where: str, fetched_at: float,
                  ahead: bool) -> Signal:
    """``ahead``: a forecast list, where every period is a forecast even if settled."""
    intensity = f.obj(f.field(period, "intensity", where), f"{where}.intensity")
    actual = f.optional_number(intensity, "actual", f"{where}.intensity")
    forecast = f.number(intensity, "forecast", f"{where}.intensity")
    value, use_forecast = (forecast, True) if ahead or actual is None else (actual, False)
    return Signal(
        kind=KIND,
        key=zone,
        value=f.intensity(value, f"{where}.intensity"),
        unit=UNIT,
        observed_at=f.timestamp(period, "from", where),
        fetched_at=fetched_at,
        source=f"{NAME}:{endpoint}",
        is_forecast=use_forecast,
        is_estimated=use_forecast,
        estimation_method="ukci-forecast" if use_forecast else None,
        # the national grid's average, from generators' direct (operational) emission factors
        signal_type="average",
        emission_factors="direct",
    )


def parse_periods(body: Any, zone: str, fetched_at: float, endpoint: str, ahead: bool,
                  ended_by: float | None = None) -> list[Signal]:
    """Every slot, or with ``ended_by`` only those whose ``to`` is after it."""
    with parsing(NAME, endpoint):
        periods = f.array(f.field(f.obj(body, "response"), "data", "response"), "response.data")
        if not periods:
            raise ProviderError(NAME, endpoint, "no_data", "empty data list")
        signals = []
        for i, raw in enumerate(periods):
            period = f.obj(raw, f"data[{i}]")
            if ended_by is not None and f.timestamp(period, "to", f"data[{i}]") <= ended_by:
                continue  # a slot already over is no forecast
            signals.append(period_signal(period, zone, endpoint, f"data[{i}]", fetched_at, ahead))
        if not signals:
            ended = datetime.fromtimestamp(ended_by or 0.0, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            raise ProviderError(NAME, endpoint, "no_data", f"every slot had ended by {ended}")
        return signals


def half_hour(t: float) -> str:
    """The start of the half hour containing ``t``, in the API's ``from`` format."""
    start = t - t % 1800.0
    return datetime.fromtimestamp(start, tz=UTC).strftime("%Y-%m-%dT%H:%MZ")


@dataclass
class UkCarbonIntensityProvider:
    http: JsonHttp
    clock: Clock = time.time
    name: str = NAME

    def _check_zone(self, zone: str, endpoint: str) -> None:
        if zone not in ZONES:
            raise ProviderError(NAME, endpoint, "unknown_zone", f"zone {zone!r}: this API serves {sorted(ZONES)}")

    async def latest(self, zone: str) -> list[Signal]:
        self._check_zone(zone, INTENSITY)
        body = await self.http.get_json(INTENSITY)
        return parse_periods(body, zone, self.clock(), INTENSITY, ahead=False)[-1:]

    async def forecast(self, zone: str) -> list[Signal]:
        endpoint = f"{INTENSITY}/{{from}}/fw24h"
        self._check_zone(zone, endpoint)
        now = self.clock()
        body = await self.http.get_json(f"{INTENSITY}/{half_hour(now)}/fw24h")
        return parse_periods(body, zone, self.clock(), endpoint, ahead=True, ended_by=now)

    async def history(self, zone: str) -> list[Signal]:
        endpoint = f"{INTENSITY}/{{from}}/pt24h"
        self._check_zone(zone, endpoint)
        body = await self.http.get_json(f"{INTENSITY}/{half_hour(self.clock())}/pt24h")
        return parse_periods(body, zone, self.clock(), endpoint, ahead=False)

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        return await fetch_parts(lambda: self.latest(zone), lambda: self.forecast(zone), skip)

    async def aclose(self) -> None:
        await self.http.aclose()
