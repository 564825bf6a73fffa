"""The carbon forecast a provider would have published: the replayed hourly files' next hours,
with a seeded forecast error. Never the truth itself unless the error is set to 0.

At time t the forecast of a zone is issued from h0, the latest hour the replayed provider has
published by t (``CarbonReplay.published_row``: the publication delay and provider outages
apply, so during an outage the last forecast before it stays in use):

    point k, k = 0 .. horizon_h - 1:  the hour h0 + k,  value = truth(h0 + k) x exp(e_k)
    e_0 = 0                                   (the published value itself)
    e_k = e_(k-1) + sigma / sqrt(24) x z_k    z_k ~ N(0, 1) independent, k >= 1

The error is multiplicative (lognormal) and grows with the lead time: log(forecast / truth)
at k hours ahead has standard deviation sigma x sqrt(k / 24), so sigma is its spread a day
ahead (default 0.15: 3 % one hour ahead, 7.5 % at 6 h, 15 % at 24 h; a mean absolute error
of about 6 % at 6 h and 12 % at 24 h, in the range of the 7 % that the UK National Grid ESO's
48 h forecast had over 2017-2023). It is a random walk along the horizon, so errors of
neighbouring hours are correlated, as in a real forecast (a forecast too high at 5 h ahead is
too high at 6 h), and a later issue draws afresh (the forecast is revised as the hour nears).
Each issue's errors come from (seed, zone, h0) alone: the same for every policy of a
comparison, independent between zones and issues. sigma = 0 gives the file's next hours,
perfect foresight (what ``scheduler.datalayer.carbon.csv_replay`` serves): an oracle bound.

Values are in gCO2eq/kWh; points are ``(hour start, value)`` for
``scheduler.deferral.window.choose_release``.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from scheduler.deferral.window import ForecastPoint
from scheduler.sim.carbon_feed import CarbonReplay

DEFAULT_ERROR = 0.15
DEFAULT_HORIZON_H = 24


class CarbonForecast:
    def __init__(self, carbon: CarbonReplay, sigma: float = DEFAULT_ERROR, seed: int = 0,
                 horizon_h: int = DEFAULT_HORIZON_H) -> None:
        if not sigma >= 0:
            raise ValueError(f"forecast error must be >= 0, got {sigma}")
        if horizon_h < 1:
            raise ValueError(f"forecast horizon must be at least 1 h, got {horizon_h}")
        self.carbon = carbon
        self.sigma = float(sigma)
        self.seed = seed
        self.horizon_h = horizon_h
        self._issued: dict[tuple[str, int], tuple[ForecastPoint, ...]] = {}

    def points(self, zone: str, t: float) -> tuple[ForecastPoint, ...]:
        """The forecast of ``zone`` in force at ``t`` (empty before the provider published anything)."""
        row = self.carbon.published_row(zone, t)
        if row < 0:
            return ()
        key = (zone, row)
        points = self._issued.get(key)
        if points is None:
            points = self._issue(zone, row)
            self._issued[key] = points
        return points

    def errors(self, zone: str, row: int) -> np.ndarray:
        """log(forecast / truth) of the issue from ``row``, per lead hour (index 0: the published hour)."""
        steps = np.zeros(self.horizon_h)
        if self.sigma > 0 and self.horizon_h > 1:
            rng = np.random.default_rng([self.seed, zlib.crc32(zone.encode()), row])
            steps[1:] = rng.standard_normal(self.horizon_h - 1) * (self.sigma / math.sqrt(24.0))
        return np.cumsum(steps)

    def _issue(self, zone: str, row: int) -> tuple[ForecastPoint, ...]:
        series = self.carbon.series[zone]
        stop = min(row + self.horizon_h, len(series.times))
        factors = np.exp(self.errors(zone, row)[: stop - row]).tolist()
        return tuple(
            (series.times[i], series.values[i] * f) for i, f in zip(range(row, stop), factors, strict=True)
        )
