"""Live-serving filter: the pool's deployment is up in its region and serves the model, with
room for the request (config ∩ live).

need = prompt_tokens + max_tokens
keep c  iff  live[region] is not fresh (the health filter judges the region then),
        or   served(c) and need <= context(c)    (scheduler.plugins.served: c's pool is up
             and serves c.model; context(c) its live context limit, its engine's max_model_len)
Reads: snapshot.live (observed_at, pools, models), snapshot.now, policy.max_age.region_state,
request.prompt_tokens, request.max_tokens. Judged when a region's fresh pool mapping changed
(``update``), again only for the regions whose mapping is another object.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from scheduler.framework.columns import BoolArray, FloatArray, fresh_pools
from scheduler.framework.plugin import Plugin, Reason, RequestView
from scheduler.plugins.served import SERVED, Verdict, region_served
from scheduler.types import Candidate, FleetSnapshot

TYPE = "pool-served"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("served", "live_context")
    served: BoolArray
    live_context: FloatArray  # inf: not reported, or the region's state is not fresh
    verdicts: tuple[Reason | None, ...]  # per fleet candidate: None (served) or why not
    judged: tuple[tuple[Verdict, ...] | None, ...]  # per region (``region_served``)

    @cached_property
    def smallest_context(self) -> float:
        """The least live context limit when all these candidates are served (a request needing no more is kept), else -inf."""
        if not len(self.served) or not self.served.all():
            return -math.inf if len(self.served) else math.inf
        return float(self.live_context.min())


@dataclass(frozen=True)
class PoolServedFilter(Plugin):
    TYPE: ClassVar[str] = TYPE
    READS: ClassVar[frozenset[str]] = frozenset({"pools"})

    def prepare(self, fleet: FleetSnapshot) -> tuple[tuple[Candidate, ...], ...]:
        return tuple(tuple(c for c in fleet.candidates if c.region.name == r.name) for r in fleet.regions)

    def update(self, snapshot: FleetSnapshot, members: tuple[tuple[Candidate, ...], ...], last: Columns | None) -> Columns:
        pools, delta = fresh_pools(snapshot)[0], snapshot.delta
        # ``last``: the columns of the delta's previous build (only the regions whose mapping changed are judged again)
        judged: list[tuple[Verdict, ...] | None] = [None] * len(members) if last is None or delta is None else list(last.judged)
        for r in range(len(members)) if last is None or delta is None else delta.pools:
            judged[r] = region_served(pools[r], members[r])
        if last is not None and tuple(judged) == last.judged:
            return last
        at = {c.index: v for group, region in zip(members, judged, strict=True) if region
              for c, v in zip(group, region, strict=True)}
        verdicts = [at.get(c.index, SERVED) for c in snapshot.candidates]
        served, contexts = np.asarray([v is None for v, _ in verdicts], dtype=bool), [context for _, context in verdicts]
        return Columns(served, np.asarray(contexts, dtype=np.float64), tuple(v for v, _ in verdicts), tuple(judged))

    def keep(self, view: RequestView, cols: Columns) -> BoolArray | None:
        need = view.request.prompt_tokens + view.request.max_tokens
        if need <= cols.smallest_context:
            return None
        keep: BoolArray = cols.served & (cols.live_context >= need)
        return keep

    def reason(self, view: RequestView, cols: Columns, position: int) -> Reason:
        verdict = cols.verdicts[int(view.base[position])]
        need = view.request.prompt_tokens + view.request.max_tokens
        return verdict or ("{:,} tokens exceed the served context limit {:,}", (need, int(cols.live_context[position])))

