"""The requests a region's gateway has in flight, and what each one shared.

Each request accumulates, while it is in flight:
- concurrency-seconds (integral of the number of requests in flight over its lifetime), so
  that its mean batch is ``concurrency_s / duration_s``;
- its share of measured GPU energy: every measured interval's joules are divided equally
  among the requests in flight during it (by time in flight: rule "equal-v1" of
  ``scheduler.energy.attribution``, online; energy spent while nothing is in flight is
  billed to nobody here).

The clock is injected; every method is synchronous and O(requests in flight).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class RequestShare:
    """What one finished request shared while it was in flight."""

    duration_s: float
    mean_batch: float
    # None: no measured energy arrived while it was in flight (no GPU meter).
    measured_j: float | None


@dataclass
class _Tally:
    started: float
    concurrency_s: float = 0.0
    measured_j: float | None = None


@dataclass
class InFlight:
    clock: Callable[[], float]
    _active: dict[str, _Tally] = field(default_factory=dict, init=False)
    _last: float | None = field(default=None, init=False)
    started_total: int = field(default=0, init=False)
    finished_total: int = field(default=0, init=False)

    @property
    def count(self) -> int:
        return len(self._active)

    def start(self, request_id: str) -> None:
        if request_id in self._active:
            raise ValueError(f"request {request_id!r} is already in flight")
        now = self._advance()
        self._active[request_id] = _Tally(started=now)
        self.started_total += 1

    def finish(self, request_id: str) -> RequestShare:
        now = self._advance()
        tally = self._active.pop(request_id)
        self.finished_total += 1
        duration = now - tally.started
        mean_batch = tally.concurrency_s / duration if duration > 0 else float(self.count + 1)
        return RequestShare(duration_s=duration, mean_batch=max(1.0, mean_batch), measured_j=tally.measured_j)

    def add_measured_energy(self, joules: float) -> None:
        """Share ``joules`` measured over the last interval among the requests in flight."""
        self._advance()
        if not self._active or joules <= 0:
            return
        share = joules / len(self._active)
        for tally in self._active.values():
            tally.measured_j = (tally.measured_j or 0.0) + share

    def _advance(self) -> float:
        now = self.clock()
        if self._last is not None and self._active:
            dt = now - self._last
            n = len(self._active)
            for tally in self._active.values():
                tally.concurrency_s += dt * n
        self._last = now
        return now
