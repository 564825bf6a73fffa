"""Dispatches a router has made that the regions' live state does not show yet.

A router decides many requests on one snapshot between two refreshes of the regions' live
state. Without counting its own dispatches, every request of that interval sees the pool as
idle as it last was, and the cheapest pool takes them all (herding): a clean region's queue
then forms from the router's own traffic before any refresh can show it. The tracker keeps,
per pool, the work the router sent there since the pool's region last published its state;
a request decided now waits behind it:

    pending_wait_s[c] = sum over dispatches to c's pool not yet in its live state of
                        prefill_s(request on c) / replicas(pool)

(the request's predicted prefill time on that pool, spread over the pool's replicas: the
router's pow-2 choice inside the pool spreads them). A dispatch leaves the tracker when its
region publishes a state observed after it, or ``horizon_s`` after it was made (a region that
does not publish is judged by the health filter, not by this). The snapshot carries the result
(``FleetSnapshot.pending_wait_s``); the framework adds it to each candidate's queue wait,
so the SLO filter and the TTFT scorer see it, and the decision stays a function of
(request, snapshot).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.datalayer.snapshot import replicas_of
from scheduler.types import Candidate, FleetSnapshot, RegionLiveState, Request

FloatArray = npt.NDArray[np.float64]
IndexArray = npt.NDArray[np.intp]


def prefill_s(snapshot: FleetSnapshot, candidate: Candidate, request: Request) -> float:
    """The request's predicted prefill time on ``candidate`` (no queue, no RTT)."""
    latency = snapshot.perf[candidate.index].latency
    prompt = request.prompt_tokens
    uncached = max(0, prompt - min(request.cached_tokens, prompt))
    pairs = uncached * (prompt - uncached * 0.5)
    return latency.prefill_s + uncached * latency.prefill_s_per_token + pairs * latency.prefill_s_per_pair


@dataclass
class PendingDispatches:
    # Longest a dispatch stays pending without a newer state of its region.
    horizon_s: float = 10.0
    # (region, pool) -> [(dispatched at, seconds of wait it adds to the pool)]
    _by_pool: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    # For one candidate tuple: each pool's candidate indices, and the per-candidate wait
    # (kept up to date by ``record``, rebuilt after ``settle``).
    _index: tuple[tuple[Candidate, ...], dict[tuple[str, str], IndexArray]] | None = None
    _array: FloatArray | None = None
    # The last snapshot ``apply`` was given and what it returned (while nothing changed).
    _applied: tuple[FleetSnapshot, FleetSnapshot] | None = None

    def record(self, snapshot: FleetSnapshot, candidate: Candidate, request: Request, at: float,
               prefill: float | None = None) -> None:
        """``request`` was sent to ``candidate`` at ``at`` (the router's clock); ``prefill``:
        ``prefill_s(snapshot, candidate, request)`` where the caller has it."""
        key = (candidate.region.name, candidate.pool.name)
        wait = (prefill_s(snapshot, candidate, request) if prefill is None else prefill) / replicas_of(candidate)
        self._by_pool.setdefault(key, []).append((at, wait))
        if self._array is not None and self._index is not None and self._index[0] is snapshot.candidates:
            array = self._array.copy()  # snapshots already handed out keep theirs
            array[self._index[1][key]] += wait
            self._array = array
        else:
            self._array = None
        self._applied = None

    def settle(self, live: Mapping[str, RegionLiveState], now: float | None = None) -> None:
        """Forget the dispatches each region's published state already shows (and, given
        ``now``, those older than ``horizon_s``)."""
        self.settle_regions({region: state.observed_at for region, state in live.items()}, now)

    def settle_regions(self, observed_at: Mapping[str, float], now: float | None = None) -> None:
        """Forget the dispatches to each region made at or before its state's ``observed_at``,
        and (given ``now``) every dispatch older than ``horizon_s``."""
        oldest = -float("inf") if now is None else now - self.horizon_s
        for key in list(self._by_pool):
            seen = max(observed_at.get(key[0], oldest), oldest)
            entries = self._by_pool[key]
            kept = [entry for entry in entries if entry[0] > seen]
            if len(kept) != len(entries):
                self._array = None
                self._applied = None
                if kept:
                    self._by_pool[key] = kept
                else:
                    del self._by_pool[key]

    def clear(self) -> None:
        self._by_pool.clear()
        self._array = None
        self._applied = None

    def apply(self, snapshot: FleetSnapshot) -> FleetSnapshot:
        """``snapshot`` with the pending wait per candidate (itself when nothing is pending)."""
        if not self._by_pool:
            return snapshot
        applied = self._applied
        if applied is not None and applied[0] is snapshot:
            return applied[1]
        if self._index is None or self._index[0] is not snapshot.candidates:
            pools: dict[tuple[str, str], list[int]] = {}
            for c in snapshot.candidates:
                pools.setdefault((c.region.name, c.pool.name), []).append(c.index)
            self._index = (snapshot.candidates, {k: np.asarray(v, dtype=np.intp) for k, v in pools.items()})
            self._array = None
        if self._array is None:
            array = np.zeros(len(snapshot.candidates))
            for key, entries in self._by_pool.items():
                index = self._index[1].get(key)
                if index is not None:
                    array[index] = sum(wait for _, wait in entries)
            self._array = array
        result = snapshot.with_pending(self._array)
        self._applied = (snapshot, result)
        return result
