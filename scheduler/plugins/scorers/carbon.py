"""Carbon scorer: grams of CO2e this request would cost on each candidate pool.

g [gCO2e] = E [J] x intensity(zone) [gCO2e/kWh] x region.pue / 3.6e6 [J/kWh]
Reads: view.energy_j; per region (prepare, per snapshot): the snapshot's carbon signal for
its grid zone (value, observed_at), its PUE, snapshot.now and policy.max_age.carbon.
Abstains when any survivor's zone signal is missing or unusable (scheduler.signal_check: not
a finite value within physical bounds, dated in the future beyond the clock-skew tolerance,
or older than policy.max_age.carbon from its observed_at): such a value never moves a cost, and grams known for some
candidates and not others would favour the unknown ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import is_
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, IndexArray, memo, region_positions
from scheduler.framework.plugin import Abstain, Lifetime, Plugin, Positions, RequestView
from scheduler.signal_check import CLOCK_SKEW_S, signal_problem
from scheduler.types import FleetSnapshot

TYPE = "carbon-scorer"
J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Columns:
    # grams per joule (intensity x PUE / 3.6e6); 0 where unusable
    g_per_j: FloatArray
    usable: BoolArray
    # per candidate: its region's position in ``why``; per region: why its signal is unusable
    region: IndexArray
    why: tuple[Abstain | None, ...]

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
        for region, signal in zip(snapshot.regions, signals, strict=True):
            problem: Abstain | None = None
            if signal is None:
                problem = Abstain("carbon", None, max_age, f"no carbon signal for zone {region.grid_zone}")
            elif (found := signal_problem(signal, now, max_age)) is not None:
                problem = Abstain("carbon", found.age_s, max_age, f"zone {region.grid_zone}: {found.reason}")
            why.append(problem)
            factors.append(0.0 if problem is not None or signal is None else signal.value * region.pue / J_PER_KWH)
        region_of = region_positions(snapshot)
        usable = np.asarray([w is None for w in why], dtype=bool)[region_of]
        columns = Columns(np.asarray(factors, dtype=np.float64)[region_of], usable, region_of, tuple(why))
        if all(w is None for w in why):
            observed = [s.observed_at for s in signals if s is not None]
            cache[("carbon-usable", self)] = (snapshot.candidates, snapshot.regions, signals, zones,
                                              min(observed, default=now), max(observed, default=now), columns)
        return columns

    def score(self, view: RequestView, cols: Columns, positions: Positions) -> FloatArray | Abstain:
        if not cols.all_usable:
            usable = cols.usable[positions]
            if not usable.all():
                worst = int(np.flatnonzero(~usable)[0])
                problem = cols.why[int(cols.region[positions][worst])]
                assert problem is not None
                return problem
        grams: FloatArray = view.energy_j[positions] * cols.g_per_j[positions]
        return grams
