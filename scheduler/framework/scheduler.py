"""``Scheduler.schedule(request, snapshot) -> Decision``: the one decision function.

Pure: no I/O, no clock but ``snapshot.now``, no randomness but a salt drawn once from the
injected RNG (it only orders exact ties). The router, the simulator and
``scheduler route --explain`` all call it. Three layers, never mixed:

1. filters (hard; every registered filter, for every policy; never relaxed): each removes
   candidates, with a reason;
2. matchers (workload to hardware; those the policy lists): narrow the survivors, never to
   nothing;
3. the objective: each scorer the policy lists reports a physical quantity per survivor,
   and each survivor's cost is

       cost [USD] = sum over scorers of  rate(scorer, workload class) [USD/unit] x quantity [unit]

   ranked lowest first. A candidate's cost depends on that candidate alone, so removing a
   candidate that was not chosen never changes the choice. A survivor whose signal is
   unusable is priced at a conservative bound by its scorer (``Bounded``; recorded as a
   fallback naming the signal, its age, the bound and the survivors priced at it), and
   ranking goes on. A scorer that abstains (no survivor's signal usable) is recorded as a
   fallback and its term dropped; if it belongs to the energy layer (or the kill switch is
   on) the policy's fallback objective (performance only) ranks instead, so no stale value
   moves a cost.

While the shared state store cannot be read (``snapshot.store_outage_s``), every decision
records a ``state-store`` fallback: regions are then judged by their last known state and the
router's own probes (scheduler.plugins.filters.region_health), and the answer says so.
"""

from __future__ import annotations

import logging
import math
import random
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, HashArray
from scheduler.framework.plugin import (
    Abstain,
    Bounded,
    CandidateSource,
    Filter,
    Picker,
    Positions,
    RequestView,
)
from scheduler.framework.predict import request_view
from scheduler.framework.registry import Plan, Registry, Term
from scheduler.framework.state import PlanState
from scheduler.policy import Policy
from scheduler.types import WORKLOAD_CLASSES, Decision, Fallback, FleetSnapshot, Rejection, Request, build_frozen

log = logging.getLogger(__name__)

KILL_SWITCH = "energy_routing_disabled"
# The fallback recorded while the shared state store cannot be read.
STATE_STORE = "state-store"


def store_fallbacks(snapshot: FleetSnapshot) -> tuple[Fallback, ...]:
    """The state-store fallback while the store is unreachable (the region-health filter then
    judges regions by their last known state and the router's own probes), else none."""
    outage_s = snapshot.store_outage_s
    if outage_s is None:
        return ()
    return (Fallback(signal=STATE_STORE, scorer="region-health", age_s=outage_s,
                     max_age_s=snapshot.policy.max_age.region_state,
                     detail=f"running without the state store for {outage_s:.0f} s: last known region state "
                            "+ the router's own probes"),)
# Mixes a candidate's key hash with the request's into a tie-break key (splitmix64's constant).
_MIX = np.uint64(0x9E3779B97F4A7C15)


def _costs(rates: FloatArray, by_survivor: FloatArray) -> FloatArray:
    """Each survivor's cost, sum over scorers of rate x quantity [USD]: one dot product per
    survivor (``by_survivor``: C-contiguous, a row of quantities per survivor), computed alike
    for every survivor. A vector-matrix product across the survivors (rates @ quantities)
    rounds some of them in other SIMD lanes than others, so two identical candidates could
    differ by an ulp, and which of them wins an exact tie would depend on their positions in
    the list rather than on the tie-break key."""
    costs: FloatArray = by_survivor.dot(rates)
    return costs


def _bound_fallbacks(scorer: str, result: Bounded, view: RequestView, positions: Positions) -> list[Fallback]:
    """One fallback per unusable signal a scorer priced survivors at a bound for, naming them
    (rare: only while some signal is unusable, so built plainly)."""
    survivors = view.base[positions]
    candidates = view.snapshot.candidates
    by_key: dict[tuple[str, str], tuple[Abstain, list[str]]] = {}
    for position, note in zip(result.bounded.tolist(), result.notes, strict=True):
        entry = by_key.setdefault((note.signal, note.key), (note, []))
        entry[1].append(candidates[int(survivors[position])].key)
    return [Fallback(note.signal, scorer, note.age_s, note.max_age_s, note.detail, note.key, note.bound,
                     note.bound_unit, tuple(keys)) for note, keys in by_key.values()]


def _cached_at(request: Request, view: RequestView, positions: Positions, survivor: int) -> int:
    """The prompt tokens the prediction credited the prefix cache with on one survivor (its
    position among the survivors): more than the request's own where its prefix is warm."""
    if view.cached_tokens is None:
        return request.cached_tokens
    position = survivor if isinstance(positions, slice) else int(positions[survivor])
    return int(view.cached_tokens[position])


@dataclass(frozen=True)
class LazyRejections:
    """The candidates one filter rejected; their positions are found and their reasons
    formatted only when read."""

    plugin: Filter
    view: RequestView
    cols: object
    # the filter's mask over the view (True: kept), and which candidates were alive before it
    # (None: all of them)
    keep: BoolArray
    alive: BoolArray | None = None

    @cached_property
    def positions(self) -> list[int]:
        """The view positions this filter rejected."""
        dropped = ~self.keep if self.alive is None else self.alive & ~self.keep
        positions: list[int] = dropped.nonzero()[0].tolist()
        return positions

    def __len__(self) -> int:
        return len(self.positions)

    def materialize(self) -> list[Rejection]:
        candidates = self.view.snapshot.candidates
        base = self.view.base
        out = []
        for position in self.positions:
            fmt, args = self.plugin.reason(self.view, self.cols, position)
            out.append(Rejection(candidates[base[position]], self.plugin.TYPE, fmt, args))
        return out


class _Ranking(NamedTuple):
    names: tuple[str, ...]
    units: tuple[str, ...]
    rates: tuple[float, ...]
    written: tuple[str, ...]
    quantities: FloatArray
    totals: FloatArray


@dataclass(frozen=True)
class _Labels:
    # the objective's terms (kept so their id stays theirs while memoized)
    terms: tuple[Term, ...]
    names: tuple[str, ...]
    units: tuple[str, ...]
    rate_values: tuple[float, ...]
    written: tuple[str, ...]
    rates: FloatArray


@dataclass(frozen=True)
class _Compiled:
    """A policy's plan with what every decision under it reuses."""

    policy: Policy
    plan: Plan
    # (plugin, may leave nothing): the hard filters, then the policy's matchers
    narrowing: tuple[tuple[Filter, bool], ...]
    # The candidate source's columns and those of every plugin a decision may read, in this
    # order: the narrowing plugins, the primary objective's scorers, the fallback objective's
    # (the state is the one mutable part: it follows the snapshots decided on under this policy).
    state: PlanState


@dataclass
class Scheduler:
    source: CandidateSource
    filters: Sequence[Filter]
    picker: Picker
    registry: Registry
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    timer: Callable[[], int] = time.perf_counter_ns
    # Plugins are timed (``Decision.plugin_timings_ns``) on one decision in ``timing_every``:
    # the first this scheduler makes, then every timing_every-th. Two clock reads per plugin
    # cost a decision more than some of its plugins do; 1 times every decision.
    timing_every: int = 16

    def __post_init__(self) -> None:
        if self.timing_every < 1:
            raise ValueError(f"timing_every must be at least 1, got {self.timing_every}")
        self._salt = self.rng.getrandbits(32)
        # id(policy) -> its compiled plan; the policy is kept in it so its id stays its own.
        self._compiled: dict[int, _Compiled] = {}
        self._label_memo: dict[tuple[int, int, int], _Labels] = {}
        self._decisions = 0

    @classmethod
    def from_registry(cls, registry: Registry, rng: random.Random | None = None) -> Scheduler:
        """Every registered filter; matchers and scorers as each snapshot's policy lists them."""
        if len(registry.sources) != 1 or len(registry.pickers) != 1:
            raise ValueError(
                f"expected one candidate source and one picker, got {sorted(registry.sources)} / {sorted(registry.pickers)}"
            )
        return cls(
            source=next(iter(registry.sources.values()))(),
            filters=[make() for make in registry.filters.values()],
            picker=next(iter(registry.pickers.values()))(),
            registry=registry,
            rng=rng or random.Random(0),
        )

    def plan(self, policy: Policy) -> Plan:
        """The policy's plugins and rates, compiled once per policy object."""
        return self._compile(policy).plan

    def _compile(self, policy: Policy) -> _Compiled:
        compiled = self._compiled.get(id(policy))
        if compiled is None or compiled.policy is not policy:
            if len(self._compiled) >= 64:
                self._compiled.clear()
            plan = self.registry.compile(policy)
            narrowing = (*((f, True) for f in self.filters), *((m, False) for m in plan.matchers))
            state = PlanState(self.source, (*(p for p, _ in narrowing), *(t.scorer for t in plan.primary),
                                            *(t.scorer for t in plan.fallback)))
            compiled = _Compiled(policy, plan, narrowing, state)
            self._compiled[id(policy)] = compiled
        return compiled

    def schedule(self, request: Request, snapshot: FleetSnapshot) -> Decision:
        policy = snapshot.policy
        compiled = self._compile(policy)
        decisions = self._decisions
        self._decisions = decisions + 1
        timer = self.timer if decisions % self.timing_every == 0 else None
        timings: dict[str, int] = {}
        source = self.source
        state = compiled.state
        state.advance(snapshot)
        if timer is None:
            base, eager_rejections = source.select(request, snapshot, state.source_columns)
        else:
            start = timer()
            base, eager_rejections = source.select(request, snapshot, state.source_columns)
            timings[source.TYPE] = timer() - start
        model = request.model
        view = request_view(request, snapshot, base, state.frame(snapshot, model, base))
        columns = state.restricted(model, base)
        lazy: list[LazyRejections] = []

        # None while every candidate is still alive (the common case: no mask work at all).
        alive: BoolArray | None = None
        count = len(base)
        for (plugin, may_empty), cols in zip(compiled.narrowing, columns, strict=False):
            if timer is None:
                keep = plugin.keep(view, cols)
            else:
                start = timer()
                keep = plugin.keep(view, cols)
                timings[plugin.TYPE] = timer() - start
            if keep is not None:
                narrowed = keep if alive is None else alive & keep
                kept = int(np.count_nonzero(narrowed))
                # A matcher that would leave nothing is ignored (it only narrows).
                if kept != count and (kept or may_empty):
                    lazy.append(build_frozen(LazyRejections, {
                        "plugin": plugin, "view": view, "cols": cols, "keep": keep, "alive": alive}))
                    alive, count = narrowed, kept

        if count == 0:
            return build_frozen(Decision, {
                "request_id": request.request_id, "decided_at": snapshot.now, "policy": policy.name,
                "fleet": snapshot.candidates, "survivor_index": (), "order": (), "totals": (), "scorer_names": (),
                "units": (), "rates": (), "rates_written": (), "quantities": (),
                "eager_rejections": tuple(eager_rejections), "lazy_rejections": tuple(lazy),
                "fallbacks": store_fallbacks(snapshot), "energy_ranking": False, "energy_inputs": None,
                "plugin_timings_ns": timings, "canary_arm": snapshot.canary_arm, "perf": snapshot.perf,
            })

        positions: Positions = slice(None) if alive is None else alive.nonzero()[0]
        fallbacks: list[Fallback] = [] if snapshot.store is None else list(store_fallbacks(snapshot))
        energy_ranking = snapshot.energy_routing_enabled
        if not energy_ranking:
            fallbacks.append(Fallback(signal=KILL_SWITCH, scorer="*", age_s=None, max_age_s=0.0,
                                      detail="energy routing switched off by an operator"))
        klass = WORKLOAD_CLASSES.index(request.workload_class)
        narrowing = len(compiled.narrowing)
        primary = compiled.plan.primary
        ranking = None
        if energy_ranking:
            ranking = self._evaluate(primary, columns[narrowing:narrowing + len(primary)], view, positions, count,
                                     klass, fallbacks, timings, timer, primary=True)
        if ranking is None:
            energy_ranking = False
            ranking = self._evaluate(compiled.plan.fallback, columns[narrowing + len(primary):], view, positions,
                                     count, klass, fallbacks, timings, timer, primary=False)
            assert ranking is not None
        survivor_index = base[positions]
        totals = ranking.totals
        order = self.picker.pick(totals, self._tiebreak(request, view, positions))
        best = snapshot.candidates[survivor_index[order[0]]]
        decision: Decision = build_frozen(Decision, {
            "request_id": request.request_id,
            "decided_at": snapshot.now,
            "policy": policy.name,
            "fleet": snapshot.candidates,
            "survivor_index": survivor_index,
            "order": order,
            "totals": totals,
            "scorer_names": ranking.names,
            "units": ranking.units,
            "rates": ranking.rates,
            "rates_written": ranking.written,
            "quantities": ranking.quantities,
            "eager_rejections": tuple(eager_rejections),
            "lazy_rejections": tuple(lazy),
            "fallbacks": tuple(fallbacks),
            "energy_ranking": energy_ranking,
            "energy_inputs": (snapshot.perf[best.index].energy, request.prompt_tokens,
                              _cached_at(request, view, positions, int(order[0])), request.max_tokens),
            "plugin_timings_ns": timings,
            "canary_arm": snapshot.canary_arm,
            "perf": snapshot.perf,
        })
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s: chose %s (cost %.3g USD) of %d; objective %s; fallbacks %s; plugin ns %s",
                request.request_id, best.key, float(totals[order[0]]), len(order),
                "primary" if energy_ranking else "fallback", [f.signal for f in fallbacks], timings,
            )
        return decision

    def _evaluate(
        self, terms: tuple[Term, ...], columns: tuple[Any, ...], view: RequestView, positions: Positions, count: int,
        klass: int, fallbacks: list[Fallback], timings: dict[str, int], timer: Callable[[], int] | None,
        primary: bool,
    ) -> _Ranking | None:
        """The quantities of ``terms``' scorers over the survivors and each survivor's cost;
        None when an energy-layer scorer of the primary objective abstained (the fallback
        objective ranks instead). A scorer that gives a non-finite quantity abstains."""
        answered: list[Term] = []
        quantities: list[FloatArray] = []
        mask = 0
        for bit, (term, cols) in enumerate(zip(terms, columns, strict=False)):
            scorer = term.scorer
            if timer is None:
                result = scorer.score(view, cols, positions)
            else:
                start = timer()
                result = scorer.score(view, cols, positions)
                timings[scorer.TYPE] = timer() - start
            if isinstance(result, Abstain):
                fallbacks.append(Fallback(result.signal, scorer.TYPE, result.age_s, result.max_age_s, result.detail,
                                          result.key))
                if primary and scorer.ENERGY_LAYER:
                    return None
                continue
            if isinstance(result, Bounded):
                fallbacks.extend(_bound_fallbacks(scorer.TYPE, result, view, positions))
                result = result.quantities
            quantities.append(result)
            answered.append(term)
            mask |= 1 << bit
        labels = self._labels(terms, mask, answered, klass)
        # the quantities survivor by survivor, as ``_costs`` takes them (stacking the scorers'
        # rows and copying their transpose costs less than writing them column by column)
        by_survivor = np.array(quantities, dtype=np.float64).T.copy() if answered else np.empty((count, 0))
        totals = _costs(labels.rates, by_survivor) if answered else np.zeros(count)
        # (a Python sum: cheaper than numpy's on a few dozen survivors; any non-finite one
        # makes it non-finite, and a finite sum that overflowed only takes the path below,
        # which then keeps every scorer)
        if not math.isfinite(sum(totals.tolist())):
            # Rare: drop the scorers that gave a non-finite quantity (recorded as fallbacks).
            scorer_finite: BoolArray = np.all(np.isfinite(by_survivor), axis=0)
            finite = [bool(ok) for ok in scorer_finite]
            for term, ok in zip(answered, finite, strict=True):
                scorer = term.scorer
                if not ok:
                    fallbacks.append(Fallback(scorer.QUANTITY, scorer.TYPE, None, 0.0,
                                              f"{scorer.TYPE} gave a non-finite {scorer.QUANTITY}"))
                    if primary and scorer.ENERGY_LAYER:
                        return None
            kept = [term for term, ok in zip(answered, finite, strict=True) if ok]
            kept_mask = sum(1 << terms.index(term) for term in kept)
            labels = self._labels(terms, kept_mask, kept, klass)
            by_survivor = np.ascontiguousarray(by_survivor[:, np.asarray(finite, dtype=bool)])
            totals = _costs(labels.rates, by_survivor) if kept else np.zeros(count)
        # (scorers x survivors, as a Decision holds them)
        # (``_Ranking(...)``, without the Python-level ``__new__`` a NamedTuple is generated with)
        ranking: _Ranking = tuple.__new__(_Ranking, (labels.names, labels.units, labels.rate_values, labels.written,
                                                     by_survivor.T, totals))
        return ranking

    def _labels(self, terms: tuple[Term, ...], mask: int, answered: list[Term], klass: int) -> _Labels:
        """Names, units and rates of the answered terms (memoized: the same few per objective)."""
        key = (id(terms), mask, klass)
        labels = self._label_memo.get(key)
        if labels is None or labels.terms is not terms:
            rates = tuple(term.rates[klass] for term in answered)
            labels = _Labels(
                terms=terms,
                names=tuple(term.scorer.TYPE for term in answered),
                units=tuple(term.scorer.UNIT for term in answered),
                rate_values=rates,
                written=tuple(term.written[klass] for term in answered),
                rates=np.asarray(rates, dtype=np.float64),
            )
            if len(self._label_memo) >= 1024:
                self._label_memo.clear()
            self._label_memo[key] = labels
        return labels

    def _tiebreak(self, request: Request, view: RequestView, positions: Positions) -> HashArray:
        """A per-candidate key mixing the candidate's key hash with the request id's: exact
        ties fall differently for different requests, and never depend on the others."""
        salt = zlib.crc32(request.request_id.encode(), self._salt)
        keys: HashArray = np.bitwise_xor(view.key_hash[positions], salt, dtype=np.uint64)
        keys *= _MIX  # a new array (``bitwise_xor`` made it), not the frame's
        return keys
