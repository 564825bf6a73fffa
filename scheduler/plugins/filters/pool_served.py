"""Live-serving filter: the pool's deployment is up in its region and serves the model, with
room for the request (config ∩ live).

need = prompt_tokens + max_tokens
keep c  iff  live[region] is not fresh, or lists no pools (the health filter judges the
             region then),
        or   c.pool is in live[region].pools
             and (the pool reports no model list, or c.model is in it)
             and need <= the pool's live context limit for c.model (its engine's max_model_len)
Reads: snapshot.live (observed_at, pools, models), snapshot.now, policy.max_age.region_state,
request.prompt_tokens, request.max_tokens. Judged when a region's fresh pool mapping changed
(``update``), again only for the regions whose mapping is another object.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, fresh_pools
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.types import Candidate, FleetSnapshot, PoolLiveState

TYPE = "pool-served"
# Per candidate of a region: (verdict: None when served, else why not; live context limit).
Judged = tuple[tuple[Reason | None, float], ...] | None  # None: every one served, no limit
Pools = Mapping[str, PoolLiveState] | None


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("served", "live_context")
    served: BoolArray
    live_context: FloatArray  # inf: not reported, or the region's state is not fresh
    verdicts: tuple[Reason | None, ...]  # per fleet candidate: None (served) or why not
    judged: tuple[Judged, ...] = ()  # per region: the verdicts on its candidates

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
    READS: ClassVar[frozenset[str]] = frozenset({"pools"})

    def prepare(self, fleet: FleetSnapshot) -> tuple[tuple[Candidate, ...], ...]:
        return tuple(tuple(c for c in fleet.candidates if c.region.name == r.name) for r in fleet.regions)

    def update(self, snapshot: FleetSnapshot, members: tuple[tuple[Candidate, ...], ...],
               last: Columns | None) -> Columns:
        pools = fresh_pools(snapshot)[0]
        if last is None or snapshot.delta is None:
            judged = tuple(_judge_region(p, group) for p, group in zip(pools, members, strict=True))
        else:  # ``last``: the columns of the delta's previous build
            changed = list(last.judged)
            for r in snapshot.delta.pools:
                changed[r] = _judge_region(pools[r], members[r])
            judged = tuple(changed)
            if judged == last.judged:
                return last
        at = {c.index: v for group, j in zip(members, judged, strict=True) if j for c, v in zip(group, j, strict=True)}
        verdicts = [at.get(c.index, (None, math.inf)) for c in snapshot.candidates]
        return Columns(np.asarray([v is None for v, _ in verdicts], dtype=bool),
                       np.asarray([context for _, context in verdicts], dtype=np.float64),
                       tuple(v for v, _ in verdicts), judged)

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


def _judge_region(pools: Pools, candidates: tuple[Candidate, ...]) -> Judged:
    """The verdicts on a region's candidates given the pool mapping of its fresh live state
    (None, or no pools: the health filter judges the region; every pool up and reporting no
    model list: every one served)."""
    if not pools or all((state := pools.get(c.pool.name)) is not None and state.models is None for c in candidates):
        return None
    judged = tuple(_judge(pools, c) for c in candidates)
    return None if all(v is None and context == math.inf for v, context in judged) else judged


def _judge(pools: Mapping[str, PoolLiveState], candidate: Candidate) -> tuple[Reason | None, float]:
    pool = pools.get(candidate.pool.name)
    if pool is None:
        return ("not served: the region serves pools {}", (", ".join(sorted(pools)) or "none",)), math.inf
    if pool.models is None:
        return None, math.inf
    context = pool.models.get(candidate.deployment.name)
    if context is None:
        return ("not served: pool {} serves {}", (candidate.pool.name, ", ".join(sorted(pool.models)) or "nothing")), \
            math.inf
    return None, float(context)
