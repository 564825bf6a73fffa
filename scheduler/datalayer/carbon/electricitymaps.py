"""Electricity Maps API v3: grid carbon intensity per zone, in gCO2eq/kWh.

Requests (Electricity Maps API reference, portal.electricitymaps.com/developer-hub/api/reference,
"Carbon intensity"; base URL ``https://api.electricitymaps.com``):
``GET /v3/carbon-intensity/latest|history|forecast?zone=Z`` with the key in the ``auth-token``
header. ``zone`` is always sent: without it the API answers for the caller's IP location,
which is never what a region means. ``emissionFactorType=lifecycle`` (the API's default,
like the shipped CSVs' LCA column) is asked for and checked in the answer.
Responses: latest ``{"zone", "carbonIntensity", "datetime", "updatedAt", "createdAt",
"emissionFactorType", "isEstimated", "estimationMethod"}``; history ``{"zone", "history":
[<same>]}``; forecast ``{"zone", "forecast": [{"carbonIntensity", "datetime"}], "updatedAt"}``.
``datetime`` is the hour the value describes: it is the signal's ``observed_at``.
Errors (help.electricitymaps.com, "API authentication errors"): 401 with ``{"error":
"Invalid auth-token", "message": ...}``; 403 ("Access denied") for a zone or endpoint the
key's plan does not cover; 429 when rate limited.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.datalayer.carbon import fields as f
from scheduler.datalayer.carbon.base import KIND, NO_SKIP, UNIT, Fetched, fetch_parts, parsing
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock, JsonHttp
from scheduler.types import Signal

NAME = "electricitymaps"
# The host the API reference documents (portal.electricitymaps.com/developer-hub/api/reference);
# api.electricitymap.org (no "s") is the older host some clients still name.
DEFAULT_BASE_URL = "https://api.electricitymaps.com"
LATEST = "/v3/carbon-intensity/latest"
HISTORY = "/v3/carbon-intensity/history"
FORECAST = "/v3/carbon-intensity/forecast"
EMISSION_FACTOR_TYPE = "lifecycle"


def check_zone(body: Mapping[str, Any], zone: str, endpoint: str) -> None:
    answered = f.text(body, "zone", "response")
    if answered != zone:
        raise ProviderError(NAME, endpoint, "unknown_zone", f"asked for zone {zone!r}, the answer is for {answered!r}")


def check_factor(point: Mapping[str, Any], endpoint: str, where: str) -> None:
    factor = f.optional_text(point, "emissionFactorType", where)
    if factor is not None and factor != EMISSION_FACTOR_TYPE:
        raise ProviderError(NAME, endpoint, "wrong_unit", f"{where}: emissionFactorType {factor!r}, expected "
                            f"{EMISSION_FACTOR_TYPE!r}")


def point_signal(point: Mapping[str, Any], zone: str, endpoint: str, where: str, fetched_at: float,
                 is_forecast: bool) -> Signal:
    check_factor(point, endpoint, where)
    estimated = False if is_forecast else f.boolean(point, "isEstimated", where)
    return Signal(
        kind=KIND,
        key=zone,
        value=f.intensity(f.number(point, "carbonIntensity", where), f"{where}.carbonIntensity"),
        unit=UNIT,
        observed_at=f.timestamp(point, "datetime", where),
        fetched_at=fetched_at,
        source=f"{NAME}:{endpoint}",
        is_forecast=is_forecast,
        is_estimated=estimated,
        estimation_method=f.optional_text(point, "estimationMethod", where) if estimated else None,
        signal_type="average",
        emission_factors=EMISSION_FACTOR_TYPE,
    )


def parse_latest(body: Any, zone: str, fetched_at: float) -> Signal:
    with parsing(NAME, LATEST):
        data = f.obj(body, "response")
        check_zone(data, zone, LATEST)
        return point_signal(data, zone, LATEST, "response", fetched_at, is_forecast=False)


def parse_series(body: Any, zone: str, fetched_at: float, endpoint: str, list_name: str) -> list[Signal]:
    is_forecast = endpoint == FORECAST
    with parsing(NAME, endpoint):
        data = f.obj(body, "response")
        check_zone(data, zone, endpoint)
        points = f.array(f.field(data, list_name, "response"), f"response.{list_name}")
        return [
            point_signal(f.obj(p, f"{list_name}[{i}]"), zone, endpoint, f"{list_name}[{i}]", fetched_at, is_forecast)
            for i, p in enumerate(points)
        ]


@dataclass
class ElectricityMapsProvider:
    http: JsonHttp
    api_key: str | None
    clock: Clock = time.time
    name: str = NAME

    async def _get(self, endpoint: str, zone: str) -> Any:
        if not self.api_key:
            raise ProviderError(NAME, endpoint, "config", "no API key (set ELECTRICITYMAPS_API_KEY)")
        params = {"zone": zone, "emissionFactorType": EMISSION_FACTOR_TYPE}
        return await self.http.get_json(endpoint, params=params, headers={"auth-token": self.api_key})

    async def latest(self, zone: str) -> list[Signal]:
        body = await self._get(LATEST, zone)
        return [parse_latest(body, zone, self.clock())]

    async def forecast(self, zone: str) -> list[Signal]:
        return parse_series(await self._get(FORECAST, zone), zone, self.clock(), FORECAST, "forecast")

    async def history(self, zone: str) -> list[Signal]:
        return parse_series(await self._get(HISTORY, zone), zone, self.clock(), HISTORY, "history")

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        return await fetch_parts(lambda: self.latest(zone), lambda: self.forecast(zone), skip)

    async def aclose(self) -> None:
        await self.http.aclose()
