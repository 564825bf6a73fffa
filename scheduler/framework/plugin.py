"""The plugin interfaces: one small Protocol per verb.

- ``CandidateSource``: the candidates serving the requested model (a precomputed index),
  with a rejection for every pool that serves no such model.
- ``Filter`` (layer 1, hard): which of the view's candidates it keeps; ``reason`` says why a
  rejected one was rejected (asked lazily, only when a Decision's rejections are read). Never
  relaxed.
- ``Matcher`` (layer 2, workload to hardware): the same shape as a filter; when it would leave
  nothing, the framework keeps every survivor.
- ``Scorer`` (layer 3): a value per survivor, higher is better; the framework clamps it to
  [0, 1] and applies the policy's weight. A scorer whose input is stale returns ``Abstain``.
- ``Picker``: orders the survivors by their weighted totals into the ranked list.

Plugins work on a ``RequestView``: the request, the snapshot, the candidate indices that
serve the model (``base``) and the per-candidate predictions the framework computes once.
Every array in the view is aligned with ``base``; a plugin indexes it with positions.
Plugins never read weights, clocks or I/O.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from scheduler.framework.arrays import BoolArray, FleetArrays, FloatArray, IndexArray
from scheduler.types import FleetSnapshot, Rejection, Request

Reason = tuple[str, tuple[object, ...]]
# Which of the view's candidates survive: an index array, or ``slice(None)`` for all of them.
Positions = IndexArray | slice


@dataclass(frozen=True, slots=True)
class Abstain:
    """A scorer's answer when a signal it needs is stale or missing."""

    signal: str
    age_s: float | None  # None: never seen
    max_age_s: float
    detail: str = ""


@dataclass(frozen=True, slots=True)
class RequestView:
    """One request against one snapshot, with the framework's predictions for each candidate
    that serves the model (arrays aligned with ``base``, candidate indices of the snapshot).

    ttft_s   = RTT + queue wait + prefill (uncached tokens, attention over the context)
    tpot_s   = decode step at the mid-output context
    energy_j = the energy model's coefficients evaluated for this request (scheduler.energy.model)
    """

    request: Request
    snapshot: FleetSnapshot
    # The snapshot's columns restricted to ``base``: cols.x[p] is the fact for base[p].
    cols: FleetArrays
    base: IndexArray
    rtt_s: FloatArray
    ttft_s: FloatArray
    tpot_s: FloatArray
    energy_j: FloatArray


class CandidateSource(Protocol):
    TYPE: ClassVar[str]

    def select(self, request: Request, snapshot: FleetSnapshot) -> tuple[IndexArray, list[Rejection]]: ...


class Filter(Protocol):
    TYPE: ClassVar[str]

    def keep(self, view: RequestView) -> BoolArray | None:
        """A mask over ``view.base`` (True: keep), or None to keep every candidate."""
        ...

    def reason(self, view: RequestView, position: int) -> Reason:
        """Why ``view.base[position]`` was rejected: a format string and its arguments."""
        ...


class Scorer(Protocol):
    TYPE: ClassVar[str]
    # The policy weight this scorer answers to (a key of ScorerWeights).
    WEIGHT: ClassVar[str]
    # True for the energy/carbon layer: its abstention switches ranking to the fallback order.
    ENERGY_LAYER: ClassVar[bool]

    def score(self, view: RequestView, positions: Positions) -> FloatArray | Abstain:
        """A value per survivor (``positions`` index the view's arrays), higher is better."""
        ...


class Picker(Protocol):
    TYPE: ClassVar[str]

    def pick(self, totals: FloatArray, rng: random.Random) -> IndexArray:
        """Indices into ``totals``, best first."""
        ...


def normalized_low_is_best(values: FloatArray) -> FloatArray:
    """1 for the lowest value, 0 for the highest, linear between; all 1 when they are equal."""
    high = np.maximum.reduce(values)
    span = high - np.minimum.reduce(values)
    if span <= 0:
        return np.ones_like(values)
    result: FloatArray = (high - values) / span
    return result
