"""``Scheduler.schedule(request, snapshot) -> Decision``: the one decision function.

Pure: no I/O, no clock but ``snapshot.now``, no randomness but the injected RNG (consulted
only to break exact ties). The router, the simulator and ``scheduler route --explain`` all
call it. Three layers, never mixed:

1. filters (hard; never relaxed): each removes candidates, with a reason;
2. matchers (workload to hardware): narrow the survivors, never to nothing;
3. scorers: each gives [0, 1] per candidate (clamped here), weighted by the policy. A scorer
   that abstains is recorded as a fallback; if it belongs to the energy layer (or energy
   routing is switched off) the ranking uses the policy's fallback weights instead, and no
   energy-layer value moves a score.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from scheduler.config.schema import ScorerWeights
from scheduler.framework.arrays import BoolArray, FloatArray
from scheduler.framework.latency import request_view
from scheduler.framework.plugin import Abstain, CandidateSource, Filter, Picker, Positions, RequestView, Scorer
from scheduler.framework.registry import Registry
from scheduler.types import Decision, Fallback, FleetSnapshot, Rejection, Request

log = logging.getLogger(__name__)

KILL_SWITCH = "energy_routing_disabled"


@dataclass(frozen=True)
class LazyRejections:
    """The candidates one filter rejected; their reasons are formatted only when read."""

    plugin: Filter
    view: RequestView
    positions: Sequence[int]

    def materialize(self) -> list[Rejection]:
        candidates = self.view.snapshot.candidates
        base = self.view.base
        out = []
        for position in self.positions:
            fmt, args = self.plugin.reason(self.view, position)
            out.append(Rejection(candidates[base[position]], self.plugin.TYPE, fmt, args))
        return out


@dataclass
class Scheduler:
    source: CandidateSource
    filters: Sequence[Filter]
    matchers: Sequence[Filter]
    scorers: Sequence[Scorer]
    picker: Picker
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    timer: Callable[[], int] = time.perf_counter_ns

    def __post_init__(self) -> None:
        self._narrowing = (*((f, True) for f in self.filters), *((m, False) for m in self.matchers))
        self._energy_layer = frozenset(s.WEIGHT for s in self.scorers if s.ENERGY_LAYER)
        self._weights_memo: dict[tuple[ScorerWeights, tuple[str, ...], bool], tuple[Mapping[str, float], FloatArray]] = {}

    def _weights(
        self, configured: ScorerWeights, names: tuple[str, ...], energy_ranking: bool
    ) -> tuple[Mapping[str, float], FloatArray]:
        """The weights applied to the scorers that answered (positive ones; no energy-layer
        weight unless energy ranking is on), as a mapping and as a row for the matrix."""
        key = (configured, names, energy_ranking)
        memo = self._weights_memo.get(key)
        if memo is None:
            all_weights = configured.as_dict()
            weights = MappingProxyType({
                name: all_weights[name]
                for name in names
                if all_weights[name] > 0 and (energy_ranking or name not in self._energy_layer)
            })
            memo = (weights, np.array([weights.get(name, 0.0) for name in names]))
            if len(self._weights_memo) < 1024:
                self._weights_memo[key] = memo
        return memo

    @classmethod
    def from_registry(cls, registry: Registry, rng: random.Random | None = None) -> Scheduler:
        """Every registered plugin, in registration order."""
        if len(registry.sources) != 1 or len(registry.pickers) != 1:
            raise ValueError(
                f"expected one candidate source and one picker, got {sorted(registry.sources)} / {sorted(registry.pickers)}"
            )
        return cls(
            source=next(iter(registry.sources.values()))(),
            filters=[make() for make in registry.filters.values()],
            matchers=[make() for make in registry.matchers.values()],
            scorers=[make() for make in registry.scorers.values()],
            picker=next(iter(registry.pickers.values()))(),
            rng=rng or random.Random(0),
        )

    def schedule(self, request: Request, snapshot: FleetSnapshot) -> Decision:
        timer = self.timer
        timings: dict[str, int] = {}
        start = timer()
        base, eager_rejections = self.source.select(request, snapshot)
        timings[self.source.TYPE] = timer() - start
        view = request_view(request, snapshot, base)
        lazy: list[LazyRejections] = []

        # None while every candidate is still alive (the common case: no mask work at all).
        alive: BoolArray | None = None
        count = len(base)
        # Filters may leave nothing; a matcher that would is ignored (it only narrows).
        for plugin, may_empty in self._narrowing:
            start = timer()
            keep = plugin.keep(view)
            timings[plugin.TYPE] = timer() - start
            if keep is not None:
                narrowed = keep if alive is None else alive & keep
                kept = int(np.count_nonzero(narrowed))
                if kept != count and (kept or may_empty):
                    dropped = ~keep if alive is None else alive & ~keep
                    lazy.append(LazyRejections(plugin, view, np.flatnonzero(dropped).tolist()))
                    alive, count = narrowed, kept

        positions: Positions = slice(None) if alive is None else np.flatnonzero(alive)
        policy = snapshot.policy
        if count == 0:
            return Decision(
                request_id=request.request_id,
                decided_at=snapshot.now,
                policy=policy.name,
                fleet=snapshot.candidates,
                survivor_index=(),
                order=(),
                totals=(),
                scorer_names=(),
                scores=(),
                eager_rejections=tuple(eager_rejections),
                lazy_rejections=tuple(lazy),
                fallbacks=(),
                weights={},
                energy_ranking=False,
                plugin_timings_ns=timings,
            )

        fallbacks: list[Fallback] = []
        names: list[str] = []
        results: list[FloatArray] = []
        energy_ranking = snapshot.energy_routing_enabled
        if not energy_ranking:
            fallbacks.append(
                Fallback(signal=KILL_SWITCH, scorer="*", age_s=None, max_age_s=0.0,
                         detail="energy routing switched off by an operator")
            )
        for scorer in self.scorers:
            if scorer.ENERGY_LAYER and not snapshot.energy_routing_enabled:
                continue
            start = timer()
            result = scorer.score(view, positions)
            timings[scorer.TYPE] = timer() - start
            if isinstance(result, Abstain):
                fallbacks.append(Fallback(result.signal, scorer.TYPE, result.age_s, result.max_age_s, result.detail))
                if scorer.ENERGY_LAYER:
                    energy_ranking = False
                continue
            names.append(scorer.WEIGHT)
            results.append(result)

        # One matrix (scorer x survivor): clamp to [0, 1] and weight in two operations.
        matrix = np.minimum(np.maximum(np.array(results, dtype=np.float64).reshape(len(results), count), 0.0), 1.0)
        scorer_names = tuple(names)
        weights, weight_row = self._weights(
            policy.weights if energy_ranking else policy.fallback.weights, scorer_names, energy_ranking)
        totals: FloatArray = weight_row @ matrix if names else np.zeros(count)
        order = self.picker.pick(totals, self.rng)
        survivor_index = base[positions]
        best = snapshot.candidates[survivor_index[order[0]]]
        decision = Decision(
            request_id=request.request_id,
            decided_at=snapshot.now,
            policy=policy.name,
            fleet=snapshot.candidates,
            survivor_index=survivor_index,
            order=order,
            totals=totals,
            scorer_names=scorer_names,
            scores=matrix,
            eager_rejections=tuple(eager_rejections),
            lazy_rejections=tuple(lazy),
            fallbacks=tuple(fallbacks),
            weights=weights,
            energy_ranking=energy_ranking,
            energy_inputs=(snapshot.perf[best.index].energy, request.prompt_tokens, request.cached_tokens,
                           request.max_tokens, snapshot.perf[best.index].queue_wait_s),
            plugin_timings_ns=timings,
        )
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request %s: chose %s (total %.3f) of %d; fallbacks %s; plugin ns %s",
                request.request_id, best.key, float(totals[order[0]]), len(order),
                [f.signal for f in fallbacks], timings,
            )
        return decision
