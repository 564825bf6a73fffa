"""Grid carbon signals: providers (Electricity Maps, WattTime, UK Carbon Intensity, Carbon
Aware SDK, CSV replay), the pollers that share them through the store, and readers."""

from scheduler.datalayer.carbon.base import CarbonProvider, Fetched
from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.providers import PROVIDERS, ProviderOptions, make_provider
from scheduler.datalayer.carbon.store_io import read_carbon, read_forecast, read_signal
from scheduler.datalayer.carbon.zone_poller import LockTiming, ZonePoller

__all__ = [
    "PROVIDERS",
    "CarbonPollers",
    "CarbonProvider",
    "Counters",
    "Fetched",
    "LockTiming",
    "ProviderError",
    "ProviderOptions",
    "ZonePoller",
    "make_provider",
    "read_carbon",
    "read_forecast",
    "read_signal",
]
