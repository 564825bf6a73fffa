"""A gateway's idle joules per pool and billing window, with what each tenant used of the pool.

The gateway tells it every idle interval its meter closes (``idle``: the pool that holds the
GPU, the joules) and every receipt it signs (``used``: the pool, the tenant, the joules the
request was billed, and the grid intensity the router signed into the ticket). Idle joules are
priced at the last such intensity the gateway saw, times the region's PUE; before it saw any
(or when the last was not a usable value), at ``UPPER_BOUND_G_PER_KWH``, counted apart as
``bounded_j``. ``closed(now)`` hands over the windows that ended, ``drain()`` every window
(the gateway is stopping), each as a ``scheduler.ledger.idle.IdleWindow`` the gateway signs
into the ``receipts`` stream; a router splits it among the tenants (docs/billing.md).

The clock is the caller's (wall time: windows are billing hours); every method is synchronous.
"""

from __future__ import annotations

import math
import uuid
from collections import defaultdict
from dataclasses import dataclass, field

from scheduler.ledger.idle import IdleWindow
from scheduler.signal_check import BOUNDS, UPPER_BOUND_G_PER_KWH
from scheduler.units import J_PER_KWH


@dataclass
class _Window:
    idle_j: float = 0.0
    carbon_g: float = 0.0
    bounded_j: float = 0.0
    used_j: dict[str, float] = field(default_factory=lambda: defaultdict(float))


@dataclass
class IdleWindows:
    region: str
    pue: float
    window_s: float = 3600.0
    gateway: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    _windows: dict[tuple[str, float], _Window] = field(default_factory=dict, init=False, repr=False)
    _intensity: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.window_s > 0:
            raise ValueError(f"idle window must be > 0 s, got {self.window_s}")

    def _window(self, pool: str, now: float) -> _Window:
        start = math.floor(now / self.window_s) * self.window_s
        return self._windows.setdefault((pool, start), _Window())

    def idle(self, pool: str, joules: float, now: float) -> None:
        window = self._window(pool, now)
        intensity = self._intensity
        if intensity is None:
            intensity = UPPER_BOUND_G_PER_KWH
            window.bounded_j += joules
        window.idle_j += joules
        window.carbon_g += joules / J_PER_KWH * intensity * self.pue

    def used(self, pool: str, tenant: str, joules: float, intensity_g_per_kwh: float | None, now: float) -> None:
        self._window(pool, now).used_j[tenant] += max(0.0, joules)
        low, high = BOUNDS["carbon_intensity"]
        usable = intensity_g_per_kwh is not None and math.isfinite(intensity_g_per_kwh) \
            and low <= intensity_g_per_kwh <= high
        self._intensity = intensity_g_per_kwh if usable else None

    def closed(self, now: float) -> list[IdleWindow]:
        """The windows that ended by ``now`` with idle joules to bill, removed (those without
        are dropped: a gateway without a meter has uses and no idle energy)."""
        ended = [key for key in self._windows if key[1] + self.window_s <= now]
        return self._records(sorted(ended, key=lambda k: (k[1], k[0])))

    def drain(self) -> list[IdleWindow]:
        """Every window with idle joules, the open ones too (partial: their record says where
        they started)."""
        return self._records(sorted(self._windows, key=lambda k: (k[1], k[0])))

    def _records(self, keys: list[tuple[str, float]]) -> list[IdleWindow]:
        windows = [(key, self._windows.pop(key)) for key in keys]
        return [self._record(key, window) for key, window in windows if window.idle_j > 0.0]

    def _record(self, key: tuple[str, float], window: _Window) -> IdleWindow:
        pool, start = key
        return IdleWindow(region=self.region, pool=pool, gateway=self.gateway, window_start=start,
                          window_s=self.window_s, idle_j=window.idle_j, carbon_g=window.carbon_g,
                          bounded_j=window.bounded_j, used_j=dict(window.used_j))
