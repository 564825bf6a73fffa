"""Affinity scorer: the prefill energy a candidate would spend rebuilding the cache that the
request's workflow holds warm where it last ran, and that nothing else has priced yet.

For a request with a workflow id whose last request this router sent to pool h (its home,
``snapshot.workflows``, younger than the policy's ``max_age.prefix_cache``) with W_h prompt
tokens, on a request of C prompt tokens:

    W  = min(W_h, S, C)           tokens of this request the home holds warm, S the request's
                                  shared_prefix_tokens (a fan-out sibling shares its system prompt,
                                  not its question; absent: C, a chain's step extends the last one's)
    w0 = min(published_h, W)      of those, what the energy model already credits at h (an engine-
                                  reported hit for the prefix key there, snapshot.prefix_warm)
    lost(c) [J] = 0 at c = h, else a_c x (W - w0) + b_c x (pairs(C - w0) - pairs(C - W))
    pairs(U)    = U x (C - U / 2)   causal attention of U uncached tokens
    a_c, b_c    = c's prefill J per token and per attention pair at its live batch (EnergyCoefficients)

i.e. ``avoided_j(C, W) - avoided_j(C, w0)`` on c: the workflow's own warmth at its home, which no region has
confirmed yet, priced once (docs/affinity.md). Never abstains (without a home every candidate is 0).
Reads: request.workflow_id, .prefix_key, .shared_prefix_tokens, snapshot.workflows, .prefix_warm, .perf.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from scheduler.framework.columns import FloatArray
from scheduler.framework.plugin import Abstain, Plugin, Positions, RequestView
from scheduler.types import FleetSnapshot

TYPE = "affinity-scorer"


@dataclass(frozen=True)
class Columns:
    PER_CANDIDATE: ClassVar[tuple[str, ...]] = ("place",)
    # per candidate: "region/pool"
    place: npt.NDArray[np.str_]


def _pairs(uncached: float, prompt: float) -> float:
    return uncached * (prompt - uncached * 0.5)


@dataclass(frozen=True)
class AffinityScorer(Plugin):
    TYPE: ClassVar[str] = TYPE
    UNIT: ClassVar[str] = "J"
    QUANTITY: ClassVar[str] = "lost cache"
    ENERGY_LAYER: ClassVar[bool] = True

    def prepare(self, fleet: FleetSnapshot) -> Columns:
        return Columns(place=np.asarray([c.key for c in fleet.candidates], dtype=np.str_))

    def score(self, view: RequestView, cols: Columns, positions: Positions) -> FloatArray | Abstain:
        request, snapshot = view.request, view.snapshot
        home = snapshot.workflows.get(request.workflow_id) if request.workflow_id else None
        place = cols.place[positions]
        if home is None:
            zeros: FloatArray = np.zeros(len(place))
            return zeros
        prompt = float(request.prompt_tokens)
        shared = request.prompt_tokens if request.shared_prefix_tokens is None else request.shared_prefix_tokens
        warm = float(min(home.cached_tokens, shared, request.prompt_tokens))
        published = next((w.cached_tokens for w in snapshot.prefix_warm.get(request.prefix_key or "", ())
                          if w.region == home.region and w.pool == home.pool), 0)
        credited = float(min(published, warm))
        tokens, pairs = warm - credited, _pairs(prompt - credited, prompt) - _pairs(prompt - warm, prompt)
        # per survivor: prefill J per uncached token and per attention pair at its live batch
        # (looked up only for a request whose workflow has a home)
        energy = [snapshot.perf[i].energy for i in view.base[positions].tolist()]
        per_token = np.asarray([e.prefill_j_per_token for e in energy], dtype=np.float64)
        per_pair = np.asarray([e.prefill_j_per_pair for e in energy], dtype=np.float64)
        lost: FloatArray = per_token * tokens + per_pair * pairs
        lost[place == home.place] = 0.0
        return lost
