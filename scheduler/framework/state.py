"""The plugins' state and columns across snapshots, owned by the framework.

One ``PlanState`` per compiled policy (scheduler.framework.scheduler) keeps, for the fleet of
the last snapshot it saw:

- every plugin's state (``prepare(fleet)``: again only when the candidates are others);
- every plugin's columns for the whole fleet (``update``), for the last snapshot: a snapshot
  that shares its ``live_key`` (a copy with other pending dispatches) reuses all of them; the
  next build of the same snapshot builder (``SnapshotDelta.since`` is the last one's key)
  updates only the plugins whose ``READS`` meet the inputs that changed
  (``SnapshotDelta.changed``); any other snapshot (another builder's, one the builder's delta
  does not describe, ``SnapshotDelta.judged``) updates every plugin from scratch;
- per model, those columns restricted to the model's candidates (``restrict``: again only for
  the plugins whose fleet columns are other objects), and the framework's own ``Frame``
  (updated at the candidates whose ``CandidatePerf`` changed, ``SnapshotDelta.perf``).

Reuse is decided here, from the delta and the declared inputs alone: a plugin holds no cache.
A ``PlanState`` follows one decision at a time (the router decides on its event loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scheduler.framework.columns import Frame, IndexArray, frame, restrict, static_columns, updated_frame
from scheduler.framework.plugin import CandidateSource, Prepares
from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, Rejection, Request


@dataclass
class _ModelColumns:
    """One model's columns: restricted from the fleet's ``fleet`` (the same tuple object while
    no plugin's fleet columns changed)."""

    fleet: tuple[Any, ...]
    restricted: tuple[Any, ...]


@dataclass
class PlanState:
    """The columns of ``plugins`` (a compiled policy's, in its order) and of the candidate
    ``source`` over the last fleet."""

    source: CandidateSource
    plugins: tuple[Prepares, ...]
    candidates: tuple[Candidate, ...] | None = None
    # the source's columns: once per fleet (a candidate source reads no snapshot input)
    source_columns: Any = None
    states: tuple[Any, ...] = ()
    # the last snapshot's fleet columns, its live_key, and its build's key (None: not a build)
    columns: tuple[Any, ...] = ()
    live_key: object = None
    build: object = None
    models: dict[str, _ModelColumns] = field(default_factory=dict)
    # per model: its frame, and the perf tuple the frame was computed from
    frames: dict[str, tuple[tuple[CandidatePerf, ...], Frame]] = field(default_factory=dict)
    static: dict[str, Any] = field(default_factory=dict)

    def advance(self, snapshot: FleetSnapshot) -> None:
        """Bring every plugin's fleet columns up to ``snapshot``."""
        if snapshot.live_key is self.live_key and snapshot.candidates is self.candidates:
            return
        delta = snapshot.delta
        if snapshot.candidates is not self.candidates:
            self._new_fleet(snapshot)
            reuse = False
        else:
            reuse = (delta is not None and delta.since is not None and delta.since is self.build
                     and delta.judged(snapshot))
        columns = self.columns
        if reuse:
            assert delta is not None
            changed = delta.changed
            fresh: list[Any] | None = None
            for i, plugin in enumerate(self.plugins):
                if plugin.READS & changed:
                    updated = plugin.update(snapshot, self.states[i], columns[i])
                    if updated is not columns[i]:
                        if fresh is None:
                            fresh = list(columns)
                        fresh[i] = updated
            if fresh is not None:
                columns = tuple(fresh)
        else:
            columns = tuple(plugin.update(snapshot, state, None) for plugin, state in zip(self.plugins, self.states,
                                                                                          strict=True))
        self.columns, self.live_key = columns, snapshot.live_key
        self.build = delta.key if delta is not None and delta.judged(snapshot) else None

    def _new_fleet(self, snapshot: FleetSnapshot) -> None:
        self.candidates = snapshot.candidates
        self.source_columns = self.source.update(snapshot, self.source.prepare(snapshot), None)
        self.states = tuple(plugin.prepare(snapshot) for plugin in self.plugins)
        self.models.clear()
        self.frames.clear()
        self.static = static_columns(snapshot.candidates)

    def restricted(self, model: str, index: IndexArray) -> tuple[Any, ...]:
        """Every plugin's columns for the candidates at ``index`` (those of ``model``)."""
        columns = self.columns
        entry = self.models.get(model)
        if entry is not None and entry.fleet is columns:
            return entry.restricted
        whole = len(index) == len(self.candidates or ())
        if entry is None:
            restricted = columns if whole else tuple(restrict(c, index) for c in columns)
        elif whole:
            restricted = columns
        else:
            restricted = tuple(last if now is was else restrict(now, index)
                               for now, was, last in zip(columns, entry.fleet, entry.restricted, strict=True))
        if len(index):  # a model nobody serves (any name a client sends) is not worth an entry
            self.models[model] = _ModelColumns(columns, restricted)
        return restricted

    def frame(self, snapshot: FleetSnapshot, model: str, index: IndexArray) -> Frame:
        """The framework's columns for ``model``'s candidates at ``snapshot``."""
        perf = snapshot.perf
        entry = self.frames.get(model)
        if entry is None:
            result = frame(snapshot, model, index, self.static)
        elif entry[0] is perf:
            return entry[1]
        else:
            delta = snapshot.delta
            # the candidates whose CandidatePerf changed since the frame's perf tuple, when known
            changed = delta.perf if delta is not None and delta.perf_since is entry[0] else None
            result = updated_frame(entry[1], perf, entry[0], changed)
        if len(index):
            self.frames[model] = (perf, result)
        return result


def prepared(plugin: Prepares, snapshot: FleetSnapshot, index: IndexArray) -> Any:
    """The plugin's columns for the candidates at ``index``, computed from scratch (the
    reference ``PlanState``'s reuse is tested against, and for looking at one plugin alone)."""
    return restrict(plugin.update(snapshot, plugin.prepare(snapshot), None), index)


def selected(source: CandidateSource, request: Request, snapshot: FleetSnapshot) -> tuple[IndexArray, tuple[Rejection, ...]]:
    """The source's candidates for ``request``, its columns computed from scratch (as ``prepared``)."""
    return source.select(request, snapshot, source.update(snapshot, source.prepare(snapshot), None))
