"""Live-serving filter: the pool's deployment is up in its region and serves the model, with
room for the request (config ∩ live).

need = prompt_tokens + max_tokens
keep c  iff  live[region] is not fresh, or lists no pools (the health filter judges the
             region then),
        or   c.pool is in live[region].pools
             and (the pool reports no model list, or c.model is in it)
             and need <= the pool's live context limit for c.model (its engine's max_model_len)
Reads: snapshot.live (observed_at, pools, models), snapshot.now, policy.max_age.region_state,
request.prompt_tokens, request.max_tokens. Judged per snapshot (prepare), again only for the
regions whose published pool mapping changed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from itertools import compress
from operator import is_not
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, fresh_pools, memo, region_members
from scheduler.framework.plugin import Lifetime, Plugin, Reason, RequestView
from scheduler.types import Candidate, FleetSnapshot, PoolLiveState, RegionLiveState

TYPE = "pool-served"


@dataclass(frozen=True)
class Columns:
    served: BoolArray
    # the live context limit (inf: not reported, or the region's state is not fresh)
    live_context: FloatArray
    # per snapshot candidate: None (served) or why not
    verdicts: tuple[Reason | None, ...]

    @cached_property
    def smallest_context(self) -> float:
        """The least live context limit when every one of these candidates is served (a
        request that needs no more is kept by all), else -inf."""
        if not len(self.served) or not self.served.all():
            return -math.inf if len(self.served) else math.inf
        return float(self.live_context.min())


@dataclass(frozen=True)
class PoolServedFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    LIFETIME: ClassVar[Lifetime | None] = "live"

    def prepare(self, snapshot: FleetSnapshot) -> Columns:
        cache = snapshot.column_cache
        entry = cache.get(("pool-served",))
        if isinstance(entry, tuple) and entry[0] is snapshot.candidates:
            layout: Layout | None = entry[4]  # (the candidates' layout, kept with the last columns)
        else:
            entry = None
            layout = memo(snapshot, ("pool-served-layout",), snapshot.candidates, lambda: _layout(snapshot))
        if layout is None:
            fresh = {r.name: snapshot.fresh_live(r.name) for r in snapshot.regions}
            judged = [_judge_in(fresh[c.region.name], c) for c in snapshot.candidates]
            return Columns(
                np.asarray([verdict is None for verdict, _ in judged], dtype=bool),
                np.asarray([context for _, context in judged], dtype=np.float64),
                tuple(verdict for verdict, _ in judged),
            )
        # Per region: the pool mapping of its fresh live state (None: none fresh; as the
        # snapshot builder judged it, ``fresh_pools``). A region is
        # judged again only when its mapping is another object than at the last build (a state
        # republished unchanged keeps its mapping), and the columns are the last ones while
        # every region judged again is judged as before (usually: every pool served, no limit).
        members, names = layout
        maps = fresh_pools(snapshot)[0]
        last: Columns | None = None
        by_region: list[Judged | None]
        if entry is not None:
            changed: Iterable[int] = compress(range(len(maps)), map(is_not, maps, entry[1]))
            by_region, last = entry[2], entry[3]
        else:
            changed, by_region = range(len(maps)), [None] * len(maps)
        for r in changed:
            region_judged = _judge_region(maps[r], members[r], names[r])
            if region_judged is not by_region[r]:
                if last is not None:
                    by_region = list(by_region)  # the last entry's stays as it was
                by_region[r] = region_judged
                last = None
        columns = _columns(snapshot, by_region, members) if last is None else last
        cache[("pool-served",)] = (snapshot.candidates, maps, by_region, columns, layout)
        return columns

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        need = view.request.prompt_tokens + view.request.max_tokens
        if need <= cols.smallest_context:
            return None
        keep: BoolArray = cols.served & (cols.live_context >= need)
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        verdict = cols.verdicts[int(view.base[position])]
        if verdict is not None:
            return verdict
        need = view.request.prompt_tokens + view.request.max_tokens
        return "{:,} tokens exceed the served context limit {:,}", (need, int(cols.live_context[position]))


Judged = tuple[list[bool], list[float], list[Reason | None]]
# per region: its candidates, and its pools' names
Layout = tuple[tuple[tuple[Candidate, ...], ...], tuple[tuple[str, ...], ...]]


def _layout(snapshot: FleetSnapshot) -> Layout | None:
    """Per region: its candidates and its pools' names, when the candidate tuple is those
    regions' candidates one after the other (``region_members``), else None."""
    members = region_members(snapshot)
    if members is None:
        return None
    return members, tuple(tuple(dict.fromkeys(c.pool.name for c in group)) for group in members)


def _columns(snapshot: FleetSnapshot, by_region: list[Judged | None],
             members: tuple[tuple[Candidate, ...], ...]) -> Columns:
    """The fleet's columns from each region's verdicts (None: every candidate served, no limit)."""
    if by_region.count(None) == len(by_region):
        # Every candidate served, no live context limit: the same columns for every such
        # snapshot of the fleet.
        n = len(snapshot.candidates)
        every: Columns = memo(snapshot, ("pool-served-all",), snapshot.candidates, lambda: Columns(
            np.ones(n, dtype=bool), np.full(n, math.inf), (None,) * n))
        return every
    served: list[bool] = []
    contexts: list[float] = []
    verdicts: list[Reason | None] = []
    for region_judged, candidates in zip(by_region, members, strict=True):
        if region_judged is None:
            served += [True] * len(candidates)
            contexts += [math.inf] * len(candidates)
            verdicts += [None] * len(candidates)
        else:
            served += region_judged[0]
            contexts += region_judged[1]
            verdicts += region_judged[2]
    return Columns(np.asarray(served, dtype=bool), np.asarray(contexts, dtype=np.float64), tuple(verdicts))


def _judge_region(pools: Mapping[str, PoolLiveState] | None, candidates: tuple[Candidate, ...],
                  pool_names: tuple[str, ...]) -> Judged | None:
    """The verdicts on a region's candidates (of the pools ``pool_names``) given the pool
    mapping of its fresh live state (None: every one served, with no live context limit)."""
    if not pools:
        return None
    # The common case, pool by pool rather than candidate by candidate: every pool is up and
    # reports no model list.
    for name in pool_names:
        state = pools.get(name)
        if state is None or state.models is not None:
            break
    else:
        return None
    verdicts = [_judge_pools(pools, c) for c in candidates]
    if all(v is None and context == math.inf for v, context in verdicts):
        return None
    return [v is None for v, _ in verdicts], [context for _, context in verdicts], [v for v, _ in verdicts]


def _judge_in(state: RegionLiveState | None, candidate: Candidate) -> tuple[Reason | None, float]:
    """The verdict on ``candidate`` given its region's fresh live state (None: not fresh)."""
    if state is None or not state.pools:
        return None, math.inf
    return _judge_pools(state.pools, candidate)


def _judge_pools(pools: Mapping[str, PoolLiveState], candidate: Candidate) -> tuple[Reason | None, float]:
    """The verdict on ``candidate`` given the (non-empty) pool mapping of its region's fresh
    live state."""
    pool = pools.get(candidate.pool.name)
    if pool is None:
        served = ", ".join(sorted(pools)) or "none"
        return ("not served: the region serves pools {}", (served,)), math.inf
    if pool.models is None:
        return None, math.inf
    context = pool.models.get(candidate.deployment.name)
    if context is None:
        return ("not served: pool {} serves {}", (candidate.pool.name, ", ".join(sorted(pool.models)) or "nothing")), \
            math.inf
    return None, float(context)
