"""Carbon scorer: grams of CO2e this request would cost on each candidate pool.

g [gCO2e] = E [J] x intensity(zone) [gCO2e/kWh] x region.pue / 3.6e6 [J/kWh]
A zone whose signal is missing or unusable (scheduler.signal_check: invalid, in the future beyond the clock-skew
tolerance, older than policy.max_age.carbon) is priced at a conservative bound instead (``carbon_bound``: the
zone's highest accepted value over the policy's trailing window, else 1,100, more than any grid averages): it
never lowers a cost, its candidates stay ranked (``Bounded``, each zone named), and a candidate's grams never
depend on the others'. Abstains when no survivor's signal is usable. Reads: view.energy_j; per region
(``update``, on a carbon change): its zone's signal, PUE, snapshot.now, max_age.carbon, snapshot.carbon_bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, cast

import numpy as np

from scheduler.fleet import Region
from scheduler.framework.columns import BoolArray, FloatArray, IndexArray, region_positions
from scheduler.framework.plugin import Abstain, Bounded, Plugin, Positions, RequestView
from scheduler.signal_check import carbon_bound, signal_problem
from scheduler.types import FleetSnapshot
from scheduler.units import J_PER_KWH

TYPE = "carbon-scorer"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("g_per_j", "usable", "region")
    g_per_j: FloatArray  # intensity x PUE / 3.6e6; at the zone's bound where unusable
    usable: BoolArray
    region: IndexArray  # per candidate: its region's position in the per-region ``why`` and ``priced``
    why: tuple[Abstain | None, ...]  # why its signal is unusable (None: usable)
    priced: tuple[Abstain | None, ...]  # the note on the bound it is then priced at
    all_usable: bool  # every candidate's signal of the fleet is usable (so any survivors' are)


@dataclass(frozen=True)
class CarbonScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "gCO2e"
    QUANTITY: ClassVar[str] = "carbon"
    ENERGY_LAYER: ClassVar[bool] = True
    READS: ClassVar[frozenset[str]] = frozenset({"carbon"})

    def prepare(self, fleet: FleetSnapshot) -> IndexArray:
        return region_positions(fleet)

    def update(self, snapshot: FleetSnapshot, region_of: IndexArray, last: Columns | None) -> Columns:
        judged = [_judge(snapshot, region) for region in snapshot.regions]
        factors, why, priced = zip(*judged, strict=True) if judged else ((), (), ())  # per region
        usable = np.asarray([w is None for w in why], dtype=bool)
        g_per_j = np.asarray(factors, dtype=np.float64)[region_of]
        return Columns(g_per_j, usable[region_of], region_of, why, priced, bool(usable.all()))

    def score(self, view: RequestView, cols: Columns, positions: Positions) -> FloatArray | Bounded | Abstain:
        grams: FloatArray = view.energy_j[positions] * cols.g_per_j[positions]
        if cols.all_usable or (usable := cols.usable[positions]).all():
            return grams
        bounded = np.flatnonzero(~usable)
        at = cols.region[positions][bounded].tolist()
        if len(bounded) == len(usable):  # no survivor's signal is usable: nothing to rank the bounds against
            return cast(Abstain, cols.why[at[0]])  # (an unusable zone's signal has a reason)
        return Bounded(grams, bounded, tuple(note for r in at if (note := cols.priced[r]) is not None))


def _judge(snapshot: FleetSnapshot, region: Region) -> tuple[float, Abstain | None, Abstain | None]:
    zone, max_age = region.grid_zone, snapshot.policy.max_age.carbon
    signal = snapshot.carbon.get(zone)
    found = None if signal is None else signal_problem(signal, snapshot.now, max_age)
    if signal is not None and found is None:
        return signal.value * region.pue / J_PER_KWH, None, None
    age, detail = (None, f"no carbon signal for zone {zone}") if found is None else (found.age_s, f"zone {zone}: {found.reason}")
    bound, basis = carbon_bound(zone, snapshot.carbon_bounds, snapshot.policy.stale_bounds.carbon_window)
    note = f"{detail}; priced at {bound:g} gCO2e/kWh, {basis}"
    return bound * region.pue / J_PER_KWH, Abstain("carbon", age, max_age, detail, key=zone), Abstain(
        "carbon", age, max_age, note, key=zone, bound=bound, bound_unit="gCO2e/kWh")
