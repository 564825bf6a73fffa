"""Carbon scorer: grams of CO2e this request would cost on each candidate pool.

g [gCO2e] = E [J] x intensity(zone) [gCO2e/kWh] x region.pue / 3.6e6 [J/kWh]
Reads: view.energy_j; per region (prepare, per snapshot): the snapshot's carbon signal for
its grid zone (value, observed_at), its PUE, snapshot.now, policy.max_age.carbon and
snapshot.carbon_bounds.

A zone whose signal is missing or unusable (scheduler.signal_check: not a finite value within
physical bounds, dated in the future beyond the clock-skew tolerance, or older than
policy.max_age.carbon from its observed_at) is priced at a conservative bound instead:

    intensity(zone) = snapshot.carbon_bounds[zone]   the zone's highest accepted value over the
                                                      policy's trailing window (data layer)
                    | UPPER_BOUND_G_PER_KWH          none known (1,100: no grid averages more)

so such a value never lowers a cost, its candidates stay in the ranking (``Bounded``, each
zone named), and a candidate's grams never depend on the others'. Abstains only when no
survivor's zone has a usable signal.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import is_
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, IndexArray, memo, region_positions
from scheduler.framework.plugin import Abstain, Bounded, Lifetime, Plugin, Positions, RequestView
from scheduler.signal_check import CLOCK_SKEW_S, UPPER_BOUND_G_PER_KWH, signal_problem
from scheduler.types import FleetSnapshot
from scheduler.units import J_PER_KWH

TYPE = "carbon-scorer"


@dataclass(frozen=True)
class Columns:
    # grams per joule (intensity x PUE / 3.6e6); at the zone's bound where unusable
    g_per_j: FloatArray
    usable: BoolArray
    # per candidate: its region's position in ``why``; per region: why its signal is unusable
    # (None: usable), and then what its candidates are priced at (a note naming the bound)
    region: IndexArray
    why: tuple[Abstain | None, ...]
    priced: tuple[Abstain | None, ...]

    @cached_property
    def all_usable(self) -> bool:
        """Every one of these candidates' signals is usable (so any survivors' are)."""
        return bool(self.usable.all())


@dataclass(frozen=True)
class CarbonScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "gCO2e"
    QUANTITY: ClassVar[str] = "carbon"
    ENERGY_LAYER: ClassVar[bool] = True
    LIFETIME: ClassVar[Lifetime | None] = "live"

    def prepare(self, snapshot: FleetSnapshot) -> Columns:
        max_age = snapshot.policy.max_age.carbon
        now = snapshot.now
        cache = snapshot.column_cache
        # Every signal usable: the columns are those of the last snapshot with the same signal
        # objects (the hourly values stay while the hour does), while the oldest of them is not
        # stale and the newest not dated in the future, judged as signal_problem judges each
        # (a float difference is monotonic in each operand: the oldest and the newest decide
        # for all of them).
        kept = cache.get(("carbon-usable", self))
        if (isinstance(kept, tuple) and kept[0] is snapshot.candidates and kept[1] is snapshot.regions
                and all(map(is_, kept[2], map(snapshot.carbon.get, kept[3]))) and now - kept[4] <= max_age
                and -(now - kept[5]) <= CLOCK_SKEW_S):
            same: Columns = kept[6]
            return same
        zones = memo(snapshot, ("carbon-zones",), snapshot.regions,
                     lambda: tuple(region.grid_zone for region in snapshot.regions))
        signals = tuple(map(snapshot.carbon.get, zones))
        factors: list[float] = []
        why: list[Abstain | None] = []
        priced: list[Abstain | None] = []
        window_h = snapshot.policy.stale_bounds.carbon_window / 3600.0
        for region, signal in zip(snapshot.regions, signals, strict=True):
            zone = region.grid_zone
            problem: Abstain | None = None
            if signal is None:
                problem = Abstain("carbon", None, max_age, f"no carbon signal for zone {zone}", key=zone)
            elif (found := signal_problem(signal, now, max_age)) is not None:
                problem = Abstain("carbon", found.age_s, max_age, f"zone {zone}: {found.reason}", key=zone)
            note: Abstain | None = None
            if problem is None:
                assert signal is not None
                factors.append(signal.value * region.pue / J_PER_KWH)
            else:
                known = snapshot.carbon_bounds.get(zone)
                bound = UPPER_BOUND_G_PER_KWH if known is None else known
                basis = (f"the zone's highest in the last {window_h:g} h" if known is not None
                         else "the fleet-wide bound (no accepted value of the zone in the window)")
                note = Abstain(problem.signal, problem.age_s, max_age,
                               f"{problem.detail}; priced at {bound:g} gCO2e/kWh, {basis}",
                               key=zone, bound=bound, bound_unit="gCO2e/kWh")
                factors.append(bound * region.pue / J_PER_KWH)
            why.append(problem)
            priced.append(note)
        region_of = region_positions(snapshot)
        usable = np.asarray([w is None for w in why], dtype=bool)[region_of]
        columns = Columns(np.asarray(factors, dtype=np.float64)[region_of], usable, region_of, tuple(why),
                          tuple(priced))
        if all(w is None for w in why):
            observed = [s.observed_at for s in signals if s is not None]
            cache[("carbon-usable", self)] = (snapshot.candidates, snapshot.regions, signals, zones,
                                              min(observed, default=now), max(observed, default=now), columns)
        return columns

    def score(self, view: RequestView, cols: Columns, positions: Positions) -> FloatArray | Bounded | Abstain:
        grams: FloatArray = view.energy_j[positions] * cols.g_per_j[positions]
        if cols.all_usable:
            return grams
        usable = cols.usable[positions]
        if usable.all():
            return grams
        regions = cols.region[positions]
        bounded = np.flatnonzero(~usable)
        at = regions[bounded].tolist()
        if len(bounded) == len(usable):
            # no survivor has a usable signal: nothing to rank the bounds against
            problem: Abstain | None = cols.why[at[0]]
            assert problem is not None
            return problem
        return Bounded(grams, bounded, tuple(note for r in at if (note := cols.priced[r]) is not None))
