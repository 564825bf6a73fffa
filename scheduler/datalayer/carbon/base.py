"""What every carbon provider offers, and the pieces they share.

A provider turns one grid zone into ``Signal``s: the latest value(s) and a forecast. Each
endpoint fails on its own: ``fetch`` returns what worked and a ``ProviderError`` for each
part that did not (its ``part`` says which), so the poller can log and count every failure and
write the rest. Parts: ``latest`` (the main signal, which sets the poll cadence), ``forecast``
and, for WattTime, ``index``. ``fetch(zone, skip)`` leaves out the secondary parts in ``skip``:
the poller skips a part the key's plan does not permit (HTTP 403) for a while.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from scheduler.datalayer.carbon.errors import FieldError, ProviderError
from scheduler.types import Signal

KIND = "carbon_intensity"
UNIT = "gCO2eq/kWh"

# The parts of a fetch. LATEST is the main one: without it the zone has no fresh signal.
LATEST = "latest"
FORECAST = "forecast"
INDEX = "index"
NO_SKIP: frozenset[str] = frozenset()

T = TypeVar("T")


@dataclass(frozen=True)
class Fetched:
    latest: tuple[Signal, ...] = ()
    forecast: tuple[Signal, ...] = ()
    failures: tuple[ProviderError, ...] = ()


class CarbonProvider(Protocol):
    name: str

    async def fetch(self, zone: str, skip: frozenset[str] = NO_SKIP) -> Fetched:
        """The latest signals (a ``carbon_intensity`` in gCO2eq/kWh, and any other kinds the
        provider has) and the forecast, leaving out the secondary parts named in ``skip``;
        never raises for a provider failure."""
        ...

    async def history(self, zone: str) -> list[Signal]:
        """About the last 24 hours; raises ``ProviderError``."""
        ...

    async def aclose(self) -> None: ...


@contextmanager
def parsing(provider: str, endpoint: str) -> Iterator[None]:
    """Turn a body that does not match the documented shape into a ``bad_field`` failure."""
    try:
        yield
    except FieldError as exc:
        raise ProviderError(provider, endpoint, "bad_field", str(exc)) from None


async def attempt(
    call: Callable[[], Awaitable[T]], part: str, skip: frozenset[str] = NO_SKIP
) -> tuple[T | None, ProviderError | None]:
    """Run one part (not at all when ``skip`` names it); its failure is marked with ``part``."""
    if part in skip:
        return None, None
    try:
        return await call(), None
    except ProviderError as exc:
        return None, exc.in_part(part)


async def fetch_parts(
    latest: Callable[[], Awaitable[list[Signal]]], forecast: Callable[[], Awaitable[list[Signal]]],
    skip: frozenset[str] = NO_SKIP,
) -> Fetched:
    """Run the latest and forecast calls one after the other (one provider, polite), keeping
    whatever succeeded; the main part (latest) is never skipped."""
    now_signals, now_error = await attempt(latest, LATEST)
    ahead, ahead_error = await attempt(forecast, FORECAST, skip)
    return Fetched(
        latest=tuple(now_signals or ()),
        forecast=tuple(ahead or ()),
        failures=tuple(e for e in (now_error, ahead_error) if e is not None),
    )
