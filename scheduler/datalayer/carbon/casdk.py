"""Carbon Aware SDK WebAPI (Green Software Foundation): a self-hosted service that fronts
WattTime or Electricity Maps and answers in gCO2eq/kWh per cloud location.

Requests and responses (Green-Software-Foundation/carbon-aware-sdk,
src/CarbonAware.WebApi/src/README.md and its OpenAPI): ``GET /emissions/bylocation?location=L
&time=T&toTime=T2`` -> ``[{"location", "time", "rating", "duration"}]`` (``rating`` in g/kWh,
``time`` the start of the interval it describes: our ``observed_at``); ``GET
/emissions/forecasts/current?location=L`` -> ``[{"generatedAt", "requestedAt", "location",
"dataStartAt", "dataEndAt", "windowSize", "optimalDataPoints", "forecastData": [{"location",
"timestamp", "duration", "value"}]}]``. Errors are ASP.NET ``ValidationProblemDetails``:
``{"type", "title", "status", "traceId", "errors": {"location": [...]}}`` (400), or
``{"title", "status", "detail"}`` from its exception filter (5xx). No data: 204 or ``[]``.
The ``location`` asked for is the cloud region name the SDK was configured with (``eastus``,
...): it is the region's carbon ``zone`` here. The SDK maps it to its data source's region and
answers with *that* name in ``location`` when backed by WattTime (``eastus`` -> ``PJM_ROANOKE``,
``westus`` -> ``CAISO_NORTH``), so the answer rarely repeats the name asked for. An answer is
accepted when every item names the requested location, or when every item names one and the
same other location: one location asked for, one answered, so it is the SDK's name for it (we
always ask for one location per request). Answers naming several locations are refused
(``unknown_zone``). The provider's region name is recorded in the signal's ``source``
(``casdk:/emissions/bylocation@CAISO_NORTH``).
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

NAME = "casdk"
BY_LOCATION = "/emissions/bylocation"
FORECAST = "/emissions/forecasts/current"
# How far back ``latest`` looks: enough for hourly sources that publish late.
LOOKBACK_S = 3 * 3600.0


def _signal(point: Mapping[str, Any], zone: str, source: str, where: str, fetched_at: float, value: str,
            at: str, is_forecast: bool) -> Signal:
    return Signal(
        kind=KIND, key=zone, value=f.intensity(f.number(point, value, where), f"{where}.{value}"), unit=UNIT,
        observed_at=f.timestamp(point, at, where), fetched_at=fetched_at, source=source, is_forecast=is_forecast,
    )


def answered_location(items: list[Mapping[str, Any]], zone: str, endpoint: str, where: str) -> str:
    """The one location ``items`` are for: ``zone`` itself, or the data source's name for it
    (see the module docstring); raises ``unknown_zone`` when they name several."""
    names = {f.text(item, "location", f"{where}[{i}]") for i, item in enumerate(items)}
    if len(names) == 1:  # ``zone`` itself, or the one name the SDK's data source gives it
        return names.pop()
    raise ProviderError(NAME, endpoint, "unknown_zone",
                        f"asked for {zone!r}, the answer is for several locations {sorted(names)}")


def source(endpoint: str, zone: str, answered: str) -> str:
    return f"{NAME}:{endpoint}" if answered == zone else f"{NAME}:{endpoint}@{answered}"


def _list(body: Any, endpoint: str, zone: str) -> list[Mapping[str, Any]]:
    items = f.array(body, "response")
    if not items:
        raise ProviderError(NAME, endpoint, "no_data", f"no data for location {zone!r}")
    return [f.obj(item, f"response[{i}]") for i, item in enumerate(items)]


def parse_emissions(body: Any, zone: str, fetched_at: float) -> list[Signal]:
    """Every interval, oldest first."""
    with parsing(NAME, BY_LOCATION):
        items = _list(body, BY_LOCATION, zone)
        src = source(BY_LOCATION, zone, answered_location(items, zone, BY_LOCATION, "response"))
        signals = [
            _signal(item, zone, src, f"response[{i}]", fetched_at, "rating", "time", False)
            for i, item in enumerate(items)
        ]
        return sorted(signals, key=lambda s: s.observed_at)


def parse_forecast(body: Any, zone: str, fetched_at: float) -> list[Signal]:
    with parsing(NAME, FORECAST):
        forecasts = _list(body, FORECAST, zone)
        answered_location(forecasts, zone, FORECAST, "response")
        first = forecasts[0]
        raw_points = f.array(f.field(first, "forecastData", "response[0]"), "response[0].forecastData")
        if not raw_points:
            raise ProviderError(NAME, FORECAST, "no_data", f"empty forecastData for {zone!r}")
        points = [f.obj(p, f"forecastData[{i}]") for i, p in enumerate(raw_points)]
        src = source(FORECAST, zone, answered_location(points, zone, FORECAST, "forecastData"))
        return [
            _signal(p, zone, src, f"forecastData[{i}]", fetched_at, "value", "timestamp", True)
            for i, p in enumerate(points)
        ]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class CarbonAwareSdkProvider:
    http: JsonHttp
    configured: bool
    clock: Clock = time.time
    name: str = NAME

    async def _emissions(self, zone: str, lookback_s: float) -> list[Signal]:
        if not self.configured:
            raise ProviderError(NAME, BY_LOCATION, "config", "no base URL (set CARBON_AWARE_SDK_URL)")
        now = self.clock()
        params = {"location": zone, "time": _iso(now - lookback_s), "toTime": _iso(now)}
        return parse_emissions(await self.http.get_json(BY_LOCATION, params), zone, self.clock())

    async def latest(self, zone: str) -> list[Signal]:
        return (await self._emissions(zone, LOOKBACK_S))[-1:]

    async def forecast(self, zone: str) -> list[Signal]:
        if not self.configured:
            raise ProviderError(NAME, FORECAST, "config", "no base URL (set CARBON_AWARE_SDK_URL)")
        return parse_forecast(await self.http.get_json(FORECAST, {"location": zone}), zone, self.clock())

    async def history(self, zone: str) -> list[Signal]:
        return await self._emissions(zone, 86400.0)

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        return await fetch_parts(lambda: self.latest(zone), lambda: self.forecast(zone), skip)

    async def aclose(self) -> None:
        await self.http.aclose()
