"""The plugin interfaces: one small Protocol per verb.

- ``CandidateSource``: the candidates serving the requested model (a precomputed index),
  with a rejection for every pool that serves no such model.
- ``Filter`` (layer 1, hard): which of the view's candidates it keeps; ``reason`` says why a
  rejected one was rejected (asked lazily, only when a Decision's rejections are read). Never
  relaxed, and never optional: every registered filter runs for every policy.
- ``Matcher`` (layer 2, workload to hardware): the same shape as a filter; when it would leave
  nothing, the framework keeps every survivor. A policy lists the matchers it uses.
- ``Scorer`` (layer 3): a physical quantity per survivor in its ``UNIT`` (J, gCO2e, ms,
  USD); the framework multiplies it by the policy's rate (USD per unit) and sums the terms
  into each candidate's cost. A scorer whose input is unusable for some survivors prices them
  at a conservative bound and returns ``Bounded`` (the decision names each); one whose input
  is unusable for every survivor returns ``Abstain``. A quantity never depends on which other
  candidates are in the list.
- ``Picker``: orders the survivors by cost into the ranked list.

A plugin is pure math over columns it computes in two steps (llm-d's PreScore idea):
``prepare(fleet)``, once per fleet and policy (it reads the snapshot's candidates, regions and
policy alone), gives its state; ``update(snapshot, state, last)`` gives its per-candidate
columns for a snapshot (``last``: those it gave for the previous one, None the first time).
The framework owns both (scheduler.framework.state): it calls ``update`` only when the
snapshot's delta (``SnapshotDelta.changed``) touches an input the plugin declares it reads
(``READS``, of ``scheduler.types.SNAPSHOT_INPUTS``), and otherwise keeps ``last``; it hands
each request the columns restricted to the candidates of its model, indexing the fields the
columns class names ``PER_CANDIDATE``. A plugin holds no cache of its own. Plugins never read
rates, clocks or I/O.

A plugin's parameters are the fields of its (frozen dataclass) class: the registry
validates a policy's ``parameters`` against them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from pydantic import ConfigDict

from scheduler.framework.columns import BoolArray, FloatArray, HashArray, IndexArray
from scheduler.framework.slo import ttft_budget_s
from scheduler.types import FleetSnapshot, Rejection, Request, build_frozen

Reason = tuple[str, tuple[object, ...]]
# Which of the view's candidates survive: an index array, or ``slice(None)`` for all of them.
Positions = IndexArray | slice


@dataclass(frozen=True, slots=True)
class Abstain:
    """Why a signal a scorer needs is unusable (stale, missing or invalid): the scorer's whole
    answer when no survivor's signal is usable, or one of the notes of a ``Bounded`` answer."""

    signal: str
    age_s: float | None  # None: never seen
    max_age_s: float
    detail: str = ""
    # Whose signal it is (a grid zone, a region; "": not said), and what a ``Bounded`` answer
    # priced the candidates that depend on it at, in ``bound_unit`` (None: not priced).
    key: str = ""
    bound: float | None = None
    bound_unit: str = ""


@dataclass(frozen=True, slots=True)
class Bounded:
    """A scorer's quantities when some survivors' signals are unusable and others' are not:
    each of those survivors is priced at a conservative bound (never below what a usable value
    could give it), named in ``notes``, and ranking goes on for every survivor. The bound
    depends on the survivor alone, so removing another candidate never changes its cost."""

    quantities: FloatArray
    # Positions (into ``quantities``) priced at a bound, and why each: ``notes[i]`` for
    # ``bounded[i]``.
    bounded: IndexArray
    notes: tuple[Abstain, ...]


@dataclass(frozen=True)
class RequestView:
    """One request against one snapshot, with the framework's predictions for each candidate
    that serves the model (arrays aligned with ``base``, candidate indices of the snapshot).

    rtt_s        = the network round trip from the client (scheduler.framework.network)
    queue_wait_s = predicted wait before the pool admits the request (data layer)
    ttft_s       = rtt_s + queue_wait_s + prefill time
    tpot_s       = decode step time at the mid-output context
    energy_j     = the energy model's prediction for this request (scheduler.energy.step)
    live         = the pool's live state is fresh (else queue wait and batch are nominal)
    cached_tokens = per candidate, the prompt tokens its prefix cache is credited with where the
                   snapshot knows the request's prefix warm there (None: request.cached_tokens
                   on every candidate; scheduler.framework.predict)
    """

    request: Request
    snapshot: FleetSnapshot
    base: IndexArray
    rtt_s: FloatArray
    queue_wait_s: FloatArray
    ttft_s: FloatArray
    tpot_s: FloatArray
    energy_j: FloatArray
    live: BoolArray
    # crc32 of each candidate's key (orders exact ties; scheduler.framework.columns)
    key_hash: HashArray
    cached_tokens: FloatArray | None = None

    @property
    def ttft_budget_s(self) -> float:
        """The request's TTFT budget (``scheduler.framework.slo``), computed once per view (the
        SLO filter and the SLO-risk scorer read it; kept in the instance's dict by hand, as
        functools.cached_property takes a lock on every first read)."""
        memo = self.__dict__
        budget: float | None = memo.get("_ttft_budget_s")
        if budget is None:
            budget = memo["_ttft_budget_s"] = ttft_budget_s(self.request, self.snapshot)
        return budget

    @classmethod
    def of(
        cls, request: Request, snapshot: FleetSnapshot, base: IndexArray, rtt_s: FloatArray, queue_wait_s: FloatArray,
        ttft_s: FloatArray, tpot_s: FloatArray, energy_j: FloatArray, live: BoolArray, key_hash: HashArray,
        cached_tokens: FloatArray | None = None,
    ) -> RequestView:
        """The same view as the constructor's, built the cheap way (once per decision)."""
        return build_frozen(cls, {
            "request": request, "snapshot": snapshot, "base": base, "rtt_s": rtt_s, "queue_wait_s": queue_wait_s,
            "ttft_s": ttft_s, "tpot_s": tpot_s, "energy_j": energy_j, "live": live, "key_hash": key_hash,
            "cached_tokens": cached_tokens,
        })


class Prepares(Protocol):
    """The two steps of a plugin's columns (the module docstring)."""

    READS: ClassVar[frozenset[str]]

    def prepare(self, fleet: FleetSnapshot) -> Any:
        """The plugin's state for the fleet (once per fleet and policy)."""
        ...

    def update(self, snapshot: FleetSnapshot, state: Any, last: Any) -> Any:
        """Per-candidate columns for the whole fleet (called when the snapshot's delta touches
        one of ``READS``; ``last``: the previous snapshot's columns, None the first time)."""
        ...


class CandidateSource(Prepares, Protocol):
    TYPE: ClassVar[str]

    def select(self, request: Request, snapshot: FleetSnapshot, cols: Any) -> tuple[IndexArray, tuple[Rejection, ...]]:
        """The candidates of the request's model, from the source's columns for the fleet."""
        ...


class Filter(Prepares, Protocol):
    """A hard filter or a matcher."""

    TYPE: ClassVar[str]

    def keep(self, view: RequestView, cols: Any) -> BoolArray | None:
        """A mask over ``view.base`` (True: keep), or None to keep every candidate. The
        framework never writes into the mask (a filter may return one of its columns)."""
        ...

    def reason(self, view: RequestView, cols: Any, position: int) -> Reason:
        """Why ``view.base[position]`` was rejected: a format string and its arguments."""
        ...


class Scorer(Prepares, Protocol):
    TYPE: ClassVar[str]
    # The quantity's unit (a name of scheduler.rates.UNITS) and a short label for it.
    UNIT: ClassVar[str]
    QUANTITY: ClassVar[str]
    # True for the energy/carbon layer: its abstention (or the kill switch) switches ranking
    # to the policy's fallback objective; such scorers may not appear in that objective.
    ENERGY_LAYER: ClassVar[bool]

    def score(self, view: RequestView, cols: Any, positions: Positions) -> FloatArray | Bounded | Abstain:
        """The quantity per survivor (``positions`` index the view's arrays), in ``UNIT``."""
        ...


class Picker(Protocol):
    TYPE: ClassVar[str]

    def pick(self, costs: FloatArray, tiebreak: HashArray) -> IndexArray:
        """Indices into ``costs``, best first; ``tiebreak`` orders exact ties (a per-candidate
        key that does not depend on the other candidates)."""
        ...


class Plugin:
    """Base of every plugin class: its dataclass fields are its parameters, which a policy's
    ``parameters`` set (validated strictly: unknown names and wrong types are errors). By
    default a plugin reads no snapshot input: its columns are its state, prepared once per
    fleet (None: it has none)."""

    __pydantic_config__ = ConfigDict(extra="forbid", strict=True)
    READS: ClassVar[frozenset[str]] = frozenset()

    def prepare(self, fleet: FleetSnapshot) -> Any:
        return None

    def update(self, snapshot: FleetSnapshot, state: Any, last: Any) -> Any:
        return state


