"""Is a timestamped signal usable now? One check shared by every reader: the carbon scorer,
the energy receipt, the router's metrics and the pollers that store signals.

A signal is unusable when its value is not a finite number within the physical bounds of
its kind, when it is dated later than ``now`` plus a clock-skew tolerance, or when it is
older than the policy's max age. An unusable signal counts as stale: never used, and the
reason travels to the decision's explanation, the metrics and the receipt.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from scheduler.types import Signal

# A signal dated this far after the reader's clock is a clock error, never the future.
CLOCK_SKEW_S = 60.0

# Physical bounds per signal kind (inclusive). Grid carbon intensity: no grid averages above
# ~1,100 gCO2e/kWh (lignite plants alone reach ~1,300); 2,000 leaves room for marginal
# signals and rejects unit mix-ups (lbs/MWh, g/MWh) and garbage.
BOUNDS: dict[str, tuple[float, float]] = {
    "carbon_intensity": (0.0, 2000.0),
}
# The intensity a request is priced and billed at when its grid's signal is unusable and
# nothing better is known about the zone: no grid's average exceeds it (gCO2e/kWh).
UPPER_BOUND_G_PER_KWH = 1100.0

ProblemKind = Literal["invalid", "future", "stale"]


@dataclass(frozen=True)
class SignalProblem:
    kind: ProblemKind
    # Seconds since observed_at (negative when dated in the future).
    age_s: float
    reason: str


def value_problem(signal: Signal) -> str | None:
    """Why the value itself can never be used (not finite, out of its kind's bounds), or None."""
    value = signal.value
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return f"value {value!r} is not a finite number"
    bounds = BOUNDS.get(signal.kind)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        return f"value {value:g} {signal.unit} is outside the physical bounds [{bounds[0]:g}, {bounds[1]:g}]"
    if not math.isfinite(signal.observed_at):
        return f"observed_at {signal.observed_at!r} is not a finite time"
    return None


def signal_problem(signal: Signal, now: float, max_age_s: float) -> SignalProblem | None:
    """None when ``signal`` may be used at ``now``; otherwise what is wrong with it."""
    invalid = value_problem(signal)
    if invalid is not None:
        age = now - signal.observed_at if math.isfinite(signal.observed_at) else math.inf
        return SignalProblem("invalid", age, f"{signal.key} from {signal.source}: {invalid}")
    age = now - signal.observed_at
    if -age > CLOCK_SKEW_S:
        return SignalProblem("future", age, f"{signal.key} from {signal.source} is dated {-age:.0f} s in the "
                                            f"future (clock-skew tolerance {CLOCK_SKEW_S:.0f} s)")
    if age > max_age_s:
        return SignalProblem("stale", age, f"{signal.key} from {signal.source} is {age:.0f} s old "
                                           f"(limit {max_age_s:.0f} s)")
    return None


def carbon_bound(zone: str, bounds: Mapping[str, float], window_s: float) -> tuple[float, str]:
    """What a zone whose carbon signal is unusable is priced at (gCO2e/kWh), and on what basis:
    its highest accepted value over the trailing window (``FleetSnapshot.carbon_bounds``), else
    UPPER_BOUND_G_PER_KWH."""
    known = bounds.get(zone)
    if known is None:
        return UPPER_BOUND_G_PER_KWH, "the fleet-wide bound (no accepted value of the zone in the window)"
    return known, f"the zone's highest in the last {window_s / 3600.0:g} h"
