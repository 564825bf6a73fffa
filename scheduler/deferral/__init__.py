"""Deferral of deferrable requests with a deadline: when to release them.

``scheduler.deferral.window`` holds the release-window choice, a pure function of a carbon
forecast, the time, the deadline and the time the request needs. The simulator's deferral
queue (``scheduler.sim.engine``) calls it, and so is the router's. ``scheduler.deferral.queue``
is the durable queue in the shared store and its release loop, ``scheduler.deferral.ops`` its
atomic operations on the store; ``scheduler.deferral.cli`` is ``scheduler deferred
list|release|purge``. Besides ``scheduler.state.store`` (the protocol and ``Atomic``), only the
CLI imports other parts of ``scheduler`` (the store factory).
"""

from scheduler.deferral.window import (
    DEADLINE,
    NO_FORECAST,
    NOW,
    REASONS,
    WINDOW,
    ForecastPoint,
    Release,
    choose_release,
)

__all__ = ["DEADLINE", "NOW", "NO_FORECAST", "REASONS", "WINDOW", "ForecastPoint", "Release", "choose_release"]
