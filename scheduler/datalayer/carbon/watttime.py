"""WattTime API v3: the marginal operating emissions rate (MOER) of a grid region.

Requests and responses (docs.watttime.org, OpenAPI "WattTime Data API (V3)"):
- ``GET /login`` with HTTP Basic (username, password) -> ``{"token": "..."}``, a bearer token
  valid for 30 minutes (``Authorization: Bearer <token>``). An expired token gets 401, or a
  403 whose body may not even be JSON (an HTML page from the gateway): on either we log in
  again once and repeat the request; refused again with the fresh token, it is an ``auth``
  failure that says so (wrong plan or scope, not an old token). Limits: 100 logins and 3,000 requests per 5 minutes,
  then 429.
- ``GET /v3/signal-index?region=R&signal_type=co2_moer`` -> ``{"data": [{"point_time",
  "value"}], "meta": {"region", "signal_type", "units": "percentile", "data_point_period_seconds",
  "model": {"date"}, "warnings"}}``: where now sits among the last 30 days, 0-100. An index,
  kept as kind ``moer_index`` with unit ``percent``; never turned into gCO2eq/kWh.
- ``GET /v3/forecast?region=R&signal_type=co2_moer`` -> same ``data``, ``meta.units:
  "lbs_co2_per_mwh"``, ``meta.generated_at``. Its first point is the current 5-minute interval
  (a model nowcast: ``is_estimated``); it is the ``carbon_intensity`` signal, and all points are
  the forecast.
- ``GET /v3/historical?region=R&signal_type=co2_moer&start&end``: same shape.
- Errors: ``{"error": ..., "message": ...}`` (e.g. 403 "Invalid scope" for a region the plan
  does not cover; 400 "Invalid query parameters").
Units: 1 lb/MWh = 453.59237 g / 1000 kWh = 0.45359237 gCO2/kWh. MOER is a marginal rate,
not the average mix the other providers give; ``source`` says which.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scheduler.datalayer.carbon import fields as f
from scheduler.datalayer.carbon.base import INDEX, KIND, LATEST, NO_SKIP, UNIT, Fetched, attempt, parsing
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock, JsonHttp
from scheduler.types import Signal

log = logging.getLogger(__name__)

NAME = "watttime"
DEFAULT_BASE_URL = "https://api.watttime.org"
LOGIN = "/login"
SIGNAL_INDEX = "/v3/signal-index"
FORECAST = "/v3/forecast"
HISTORICAL = "/v3/historical"
SIGNAL_TYPE = "co2_moer"
LBS_PER_MWH_TO_G_PER_KWH = 0.45359237
INDEX_KIND = "moer_index"
INDEX_UNIT = "percent"
# Tokens last 30 minutes; renew a little before, so a poll rarely meets a 401.
TOKEN_RENEW_AFTER_S = 25 * 60.0
# A refused token: 401, or 403 (with a JSON error or an HTML page).
TOKEN_REFUSED = frozenset({401, 403})


def _data(body: Any, region: str, endpoint: str, units: str) -> tuple[list[Mapping[str, Any]], Mapping[str, Any]]:
    data = f.obj(body, "response")
    meta = f.obj(f.field(data, "meta", "response"), "response.meta")
    answered = f.text(meta, "region", "meta")
    if answered != region:
        raise ProviderError(NAME, endpoint, "unknown_zone", f"asked for region {region!r}, answer for {answered!r}")
    signal_type = f.text(meta, "signal_type", "meta")
    if signal_type != SIGNAL_TYPE:
        raise ProviderError(NAME, endpoint, "wrong_unit", f"meta.signal_type {signal_type!r}, expected {SIGNAL_TYPE!r}")
    got = f.text(meta, "units", "meta")
    if got != units:
        raise ProviderError(NAME, endpoint, "wrong_unit", f"meta.units {got!r}, expected {units!r}")
    points = f.array(f.field(data, "data", "response"), "response.data")
    if not points:
        raise ProviderError(NAME, endpoint, "no_data", f"no data points for region {region!r}")
    return [f.obj(p, f"data[{i}]") for i, p in enumerate(points)], meta


def _grams(point: Mapping[str, Any], where: str) -> float:
    return f.intensity(f.number(point, "value", where) * LBS_PER_MWH_TO_G_PER_KWH, f"{where}.value")


def parse_index(body: Any, region: str, fetched_at: float) -> Signal:
    with parsing(NAME, SIGNAL_INDEX):
        points, _ = _data(body, region, SIGNAL_INDEX, "percentile")
        value = f.number(points[0], "value", "data[0]")
        if not 0.0 <= value <= 100.0:
            raise ProviderError(NAME, SIGNAL_INDEX, "wrong_unit", f"percentile {value} is outside 0..100")
        return Signal(
            kind=INDEX_KIND, key=region, value=value, unit=INDEX_UNIT,
            observed_at=f.timestamp(points[0], "point_time", "data[0]"), fetched_at=fetched_at,
            source=f"{NAME}:{SIGNAL_INDEX}",
        )


def parse_moer(body: Any, region: str, fetched_at: float, endpoint: str) -> list[Signal]:
    """Every point in gCO2eq/kWh; forecast points are marked ``is_forecast``."""
    with parsing(NAME, endpoint):
        points, _ = _data(body, region, endpoint, "lbs_co2_per_mwh")
        return [
            Signal(
                kind=KIND, key=region, value=_grams(p, f"data[{i}]"), unit=UNIT,
                observed_at=f.timestamp(p, "point_time", f"data[{i}]"), fetched_at=fetched_at,
                source=f"{NAME}:{endpoint}", is_forecast=endpoint == FORECAST,
                # the marginal operating emissions rate: the plants that answer one more kWh,
                # combustion only
                signal_type="marginal", emission_factors="direct",
            )
            for i, p in enumerate(points)
        ]


def nowcast(forecast: list[Signal]) -> Signal:
    """The forecast's first point, the current interval: a model estimate of now."""
    first = forecast[0]
    return Signal(
        kind=first.kind, key=first.key, value=first.value, unit=first.unit, observed_at=first.observed_at,
        fetched_at=first.fetched_at, source=first.source, is_estimated=True,
        estimation_method="watttime-forecast-current-interval", signal_type=first.signal_type,
        emission_factors=first.emission_factors,
    )


@dataclass
class WattTimeProvider:
    http: JsonHttp
    username: str | None
    password: str | None
    clock: Clock = time.time
    name: str = NAME
    _token: str | None = field(default=None, init=False, repr=False)
    _token_at: float = field(default=0.0, init=False, repr=False)
    _login_lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    async def _login(self) -> str:
        if not self.username or not self.password:
            raise ProviderError(NAME, LOGIN, "config", "no credentials (set WATTTIME_USERNAME and WATTTIME_PASSWORD)")
        body = await self.http.get_json(LOGIN, auth=(self.username, self.password))
        with parsing(NAME, LOGIN):
            token = f.text(f.obj(body, "response"), "token", "response")
        self._token, self._token_at = token, self.clock()
        log.info("watttime: logged in as %s", self.username)
        return token

    async def _valid_token(self) -> tuple[str, bool]:
        """The token, and whether it was just issued."""
        async with self._login_lock:
            if self._token is not None and self.clock() - self._token_at < TOKEN_RENEW_AFTER_S:
                return self._token, False
            return await self._login(), True

    async def _get(self, endpoint: str, params: Mapping[str, str]) -> Any:
        token, fresh = await self._valid_token()
        try:
            return await self.http.get_json(endpoint, params, headers={"Authorization": f"Bearer {token}"})
        except ProviderError as exc:
            if exc.status not in TOKEN_REFUSED or fresh:
                raise
            log.info("watttime %s: token refused (HTTP %s), logging in again", endpoint, exc.status)
        async with self._login_lock:
            if self._token == token:  # not already renewed by a concurrent request
                self._token = None
        token, _ = await self._valid_token()
        try:
            return await self.http.get_json(endpoint, params, headers={"Authorization": f"Bearer {token}"})
        except ProviderError as exc:
            if exc.status not in TOKEN_REFUSED:
                raise
            raise ProviderError(NAME, endpoint, "auth", f"{exc.detail} (refused again right after a fresh login: "
                                f"the account's plan does not cover this request)", exc.status) from None

    async def index(self, region: str) -> Signal:
        body = await self._get(SIGNAL_INDEX, {"region": region, "signal_type": SIGNAL_TYPE})
        return parse_index(body, region, self.clock())

    async def forecast(self, region: str) -> list[Signal]:
        body = await self._get(FORECAST, {"region": region, "signal_type": SIGNAL_TYPE})
        return parse_moer(body, region, self.clock(), FORECAST)

    async def history(self, zone: str) -> list[Signal]:
        end = self.clock()
        params = {"region": zone, "signal_type": SIGNAL_TYPE, "start": _iso(end - 86400.0), "end": _iso(end)}
        return parse_moer(await self._get(HISTORICAL, params), zone, self.clock(), HISTORICAL)

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        # The forecast's first point is the current intensity, so the forecast endpoint is the
        # main part (LATEST); the index is a separate kind, a secondary part.
        ahead, ahead_error = await attempt(lambda: self.forecast(zone), LATEST)
        index, index_error = await attempt(lambda: self.index(zone), INDEX, skip)
        latest = ([nowcast(ahead)] if ahead else []) + ([index] if index is not None else [])
        return Fetched(
            latest=tuple(latest),
            forecast=tuple(ahead or ()),
            failures=tuple(e for e in (ahead_error, index_error) if e is not None),
        )

    async def aclose(self) -> None:
        await self.http.aclose()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
