"""Making a provider from its name (``RegionConfig.carbon.provider``): one table, one
factory per provider. Base URLs and credentials come from the constructor arguments, else
from the environment:

  electricitymaps  ELECTRICITYMAPS_API_KEY, ELECTRICITYMAPS_URL (default api.electricitymaps.com)
  watttime         WATTTIME_USERNAME, WATTTIME_PASSWORD, WATTTIME_URL (default api.watttime.org)
  ukci             UKCI_URL (default api.carbonintensity.org.uk)
  casdk            CARBON_AWARE_SDK_URL (no default: the WebAPI is self-hosted)
  csv              CARBON_CSV_DIR (default: the shipped files), CARBON_CSV_SPEED (default 1)

Missing credentials do not stop the process: each fetch then fails with reason ``config``,
logged and counted like any other failure.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import httpx

from scheduler.datalayer.carbon import casdk, electricitymaps, ukci, watttime
from scheduler.datalayer.carbon.base import CarbonProvider
from scheduler.datalayer.carbon.csv_replay import CsvReplayProvider
from scheduler.datalayer.carbon.http import PROVIDER_RETRY, Clock, JsonHttp
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR
from scheduler.wire.retry import RetryPolicy, Sleep

USER_AGENT = "carbon-scheduler (grid carbon poller)"
# A local, unreachable address: a casdk provider without a URL fails with reason "config"
# before any request is made.
_NO_URL = "http://casdk.invalid"


@dataclass(frozen=True)
class ProviderOptions:
    base_url: str | None = None
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    timeout_s: float = 10.0
    retry: RetryPolicy = PROVIDER_RETRY
    clock: Clock = time.time
    rng: random.Random = field(default_factory=random.Random)
    sleep: Sleep = asyncio.sleep
    csv_dir: Path | None = None
    csv_speed: float | None = None

    def url(self, env_name: str, default: str) -> str:
        return self.base_url or self.env.get(env_name) or default

    def http(self, provider: str, base_url: str) -> JsonHttp:
        client = httpx.AsyncClient(
            base_url=base_url, timeout=httpx.Timeout(self.timeout_s), headers={"User-Agent": USER_AGENT}
        )
        return JsonHttp(client, provider, self.retry, self.rng, self.sleep, self.clock)


def _electricitymaps(o: ProviderOptions) -> CarbonProvider:
    base = o.url("ELECTRICITYMAPS_URL", electricitymaps.DEFAULT_BASE_URL)
    return electricitymaps.ElectricityMapsProvider(
        o.http(electricitymaps.NAME, base), o.env.get("ELECTRICITYMAPS_API_KEY"), o.clock
    )


def _watttime(o: ProviderOptions) -> CarbonProvider:
    base = o.url("WATTTIME_URL", watttime.DEFAULT_BASE_URL)
    return watttime.WattTimeProvider(
        o.http(watttime.NAME, base), o.env.get("WATTTIME_USERNAME"), o.env.get("WATTTIME_PASSWORD"), o.clock
    )


def _ukci(o: ProviderOptions) -> CarbonProvider:
    return ukci.UkCarbonIntensityProvider(o.http(ukci.NAME, o.url("UKCI_URL", ukci.DEFAULT_BASE_URL)), o.clock)


def _casdk(o: ProviderOptions) -> CarbonProvider:
    base = o.url("CARBON_AWARE_SDK_URL", "")
    return casdk.CarbonAwareSdkProvider(o.http(casdk.NAME, base or _NO_URL), bool(base), o.clock)


def _csv(o: ProviderOptions) -> CarbonProvider:
    directory = o.csv_dir or Path(o.env.get("CARBON_CSV_DIR") or SHIPPED_CARBON_DIR)
    speed = o.csv_speed if o.csv_speed is not None else float(o.env.get("CARBON_CSV_SPEED") or 1.0)
    return CsvReplayProvider(directory=directory, speed=speed, clock=o.clock)


PROVIDERS: Mapping[str, Callable[[ProviderOptions], CarbonProvider]] = MappingProxyType(
    {
        electricitymaps.NAME: _electricitymaps,
        watttime.NAME: _watttime,
        ukci.NAME: _ukci,
        casdk.NAME: _casdk,
        "csv": _csv,
    }
)


def make_provider(name: str, options: ProviderOptions | None = None) -> CarbonProvider:
    factory = PROVIDERS.get(name)
    if factory is None:
        raise ValueError(f"unknown carbon provider {name!r} (known: {', '.join(PROVIDERS)})")
    return factory(options or ProviderOptions())
