"""What a region's fresh live state says of its candidates: whether each one's pool is up and
serves its model, and the pool's live context limit for it (the pool-served filter spreads the
verdicts, scheduler.plugins.filters.pool_served).

served(c)  iff  the region's fresh state lists no pools (the health filter judges it then),
           or   c.pool is in its pools and (the pool reports no model list, or c.model is in it)
context(c) = the pool's reported context limit for c.model (its engine's max_model_len), else inf
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from scheduler.types import Candidate, PoolLiveState

# (None when served, else why not: a format string and its arguments; the live context limit)
Verdict = tuple[tuple[str, tuple[object, ...]] | None, float]
SERVED: Verdict = (None, math.inf)


def region_served(pools: Mapping[str, PoolLiveState] | None, candidates: tuple[Candidate, ...]) -> tuple[Verdict, ...] | None:
    """The verdicts on a region's candidates given the pool mapping of its fresh live state
    (None: not fresh); None when every one is served with no limit (the common case, judged
    pool by pool: every pool up and reporting no model list)."""
    if not pools or all((state := pools.get(c.pool.name)) is not None and state.models is None for c in candidates):
        return None
    judged = tuple(served(pools, c) for c in candidates)
    return None if all(verdict == SERVED for verdict in judged) else judged


def served(pools: Mapping[str, PoolLiveState], candidate: Candidate) -> Verdict:
    """The verdict on ``candidate`` given the (non-empty) pool mapping of its region's fresh state."""
    pool = pools.get(candidate.pool.name)
    if pool is None:
        return ("not served: the region serves pools {}", (", ".join(sorted(pools)) or "none",)), math.inf
    if pool.models is None:
        return SERVED
    context = pool.models.get(candidate.deployment.name)
    if context is None:
        return ("not served: pool {} serves {}", (candidate.pool.name, ", ".join(sorted(pool.models)) or "nothing")), math.inf
    return None, float(context)
