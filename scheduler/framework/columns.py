"""The snapshot as columns: the framework's own per-candidate facts, and the cache of every
plugin's prepared columns.

A decision touches every candidate that serves the model several times (filters, the
predictions, the scorers). Done per candidate in Python that costs ~3 us per candidate; as
numpy columns it costs ~1 us per operation whatever the fleet size.

The framework's columns (``Frame``) are the candidate index by model, each candidate's
region, location and tie-break key, and a memo of RTT rows per client location (static: once
per candidate tuple) and the prediction matrix from each candidate's ``CandidatePerf`` (once
per perf tuple, which the snapshot builder reuses while no pool's live state changes; a new
perf tuple recomputes only the rows of the candidates whose ``CandidatePerf`` changed, which
the builder records in the snapshot, ``perf_changes``: no scan of the fleet for them). A
plugin's columns come from its ``prepare`` and live as long as its ``LIFETIME`` says
(``live``: as long as the snapshot's ``live_key``, which the snapshots that differ only in
pending dispatches share). All of them are kept in the snapshot's ``column_cache`` (shared by
the snapshots of one builder), each entry with the snapshot part it was computed from, and
restricted once per model to that model's candidates: every request for a model starts from
them.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import attrgetter, is_not
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, PoolLiveState, RegionLiveState, build_frozen

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]
HashArray = npt.NDArray[np.uint64]

# The request features every prediction is linear in (scheduler.framework.predict):
# 1, uncached prompt tokens U, attention pairs U x (prompt - U / 2), mid-output context
# prompt + N / 2, output tokens N, and N x mid-output context.
REQUEST_FEATURES = ("one", "uncached", "pairs", "mid_context", "out", "out_x_mid_context")
PREDICTIONS = ("energy_j", "ttft_s_without_rtt", "tpot_s")
_MEMO_LIMIT = 4096


class Prepares(Protocol):
    """What the cache needs of a plugin (scheduler.framework.plugin.Filter / Scorer)."""

    @property
    def LIFETIME(self) -> str | None: ...

    def prepare(self, snapshot: FleetSnapshot) -> Any: ...


@dataclass(frozen=True)
class Frame:
    """The framework's per-candidate columns, for the whole fleet (``model`` "") or restricted
    to the candidates of one model (then column p is the candidate ``index[p]``)."""

    model: str
    index: IndexArray
    region_index: IndexArray
    lat_rad: FloatArray
    lon_rad: FloatArray
    # crc32 of the candidate's region/pool/model: orders exact ties the same way whoever else
    # is in the list.
    key_hash: HashArray
    # (PREDICTIONS x candidates) x REQUEST_FEATURES: ``prediction @ features`` is every
    # candidate's energy_j, then every candidate's ttft_s without RTT, then every tpot_s
    # (row p x n + i: prediction p of candidate i; one 6-term dot product per row, computed
    # alike for every row, so identical candidates get identical predictions).
    prediction: FloatArray
    queue_wait_s: FloatArray
    live: BoolArray
    # client (lat, lon) -> the RTT row over these candidates (scheduler.framework.network):
    # one memo per candidate tuple and model, shared by the frames of every perf tuple.
    rtt_memo: dict[tuple[float, float], FloatArray] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)


def _col(values: list[float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def _static(candidates: tuple[Candidate, ...]) -> dict[str, Any]:
    regions: dict[str, int] = {}
    for c in candidates:
        regions.setdefault(c.region.name, len(regions))
    return {
        "region_index": np.asarray([regions[c.region.name] for c in candidates], dtype=np.intp),
        "lat_rad": np.radians(_col([c.region.location.lat for c in candidates])),
        "lon_rad": np.radians(_col([c.region.location.lon for c in candidates])),
        "key_hash": np.asarray(
            [zlib.crc32(f"{c.key}/{c.deployment.name}".encode()) for c in candidates], dtype=np.uint64),
    }


def _coefficients(p: CandidatePerf) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    """One candidate's PREDICTIONS x REQUEST_FEATURES coefficients."""
    e, t = p.energy, p.latency
    return (
        # EnergyCoefficients.joules: ... + (N - 1) (step_j + step_j_per_context_token x mid),
        # + the wake-up of a cold pool
        (e.start_j - e.step_j + p.wake_j, e.prefill_j_per_token, e.prefill_j_per_pair, -e.step_j_per_context_token,
         e.step_j, e.step_j_per_context_token),
        # queue wait + a cold pool's start + LatencyCoefficients prefill
        (p.queue_wait_s + p.cold_start_s + t.prefill_s, t.prefill_s_per_token, t.prefill_s_per_pair, 0.0, 0.0, 0.0),
        # LatencyCoefficients tpot
        (t.tpot_s, 0.0, 0.0, t.tpot_s_per_context_token, 0.0, 0.0),
    )


def _prediction_block(perf: list[CandidatePerf]) -> FloatArray:
    """(PREDICTIONS x len(perf)) x REQUEST_FEATURES, the layout of ``Frame.prediction``."""
    n = len(perf)
    rows = np.asarray([_coefficients(p) for p in perf], dtype=np.float64).reshape(n, len(PREDICTIONS),
                                                                                   len(REQUEST_FEATURES))
    block: FloatArray = np.ascontiguousarray(rows.transpose(1, 0, 2)).reshape(-1, len(REQUEST_FEATURES))
    return block


def _perf_columns(perf: list[CandidatePerf]) -> dict[str, Any]:
    """The prediction block, queue waits and live flags of these candidates (``Frame`` layout)."""
    return {
        "prediction": _prediction_block(perf),
        "queue_wait_s": _col([p.queue_wait_s for p in perf]),
        "live": np.asarray([p.live for p in perf], dtype=bool),
    }


def _updated(last: Frame, changed: list[tuple[int, int]], perf: tuple[CandidatePerf, ...],
             previous: tuple[CandidatePerf, ...]) -> dict[str, Any]:
    """``last``'s perf columns (computed from ``previous``) with the candidates ``changed``
    ((position in the frame, index in the fleet) pairs) computed again from ``perf`` (the
    fleet's)."""
    prediction = last.prediction.copy()  # the last frame keeps its own
    queue_wait_s = last.queue_wait_s.copy()
    live = last.live.copy()
    # rows k x m + position, PREDICTIONS-major; a few candidates change at a time: row by row
    # (a flat tuple each) is cheaper than one assignment of nested tuples or index arrays
    m = len(last.index)
    for position, i in changed:
        p, was = perf[i], previous[i]
        if p.energy is was.energy and p.latency is was.latency:
            # The same step-model coefficients (the snapshot builder keeps them per operating
            # point: a pool whose rates alone moved, or that went cold or warm): of the rows,
            # only the constants may be others, the energy's (the wake-up) and the TTFT's
            # (queue wait + cold start + prefill_s).
            prediction[position, 0] = p.energy.start_j - p.energy.step_j + p.wake_j
            prediction[m + position, 0] = p.queue_wait_s + p.cold_start_s + p.latency.prefill_s
        else:
            energy, ttft, tpot = _coefficients(p)
            prediction[position] = energy
            prediction[m + position] = ttft
            prediction[2 * m + position] = tpot
        queue_wait_s[position] = p.queue_wait_s
        live[position] = p.live
    return {"prediction": prediction, "queue_wait_s": queue_wait_s, "live": live}


def perf_changes(snapshot: FleetSnapshot, previous: tuple[CandidatePerf, ...]) -> Sequence[int]:
    """The indices of the candidates whose ``CandidatePerf`` in ``snapshot.perf`` is another
    object than in ``previous`` (a perf tuple of the same candidates): as the snapshot builder
    recorded them when ``previous`` is its last build's tuple (``FleetSnapshot.perf_changes``),
    else by comparing every candidate."""
    changes = snapshot.perf_changes
    if changes is not None and changes[0] is previous:
        return changes[1]
    perf = snapshot.perf
    return list(compress(range(len(perf)), map(is_not, perf, previous)))


def perf_rows(snapshot: FleetSnapshot, key: object, row: Callable[[CandidatePerf], tuple[float, ...]],
              width: int) -> FloatArray:
    """``row(perf)`` (``width`` numbers) of every candidate (candidates x width), for plugins of
    ``LIFETIME`` "perf": once per perf tuple, and from the last perf tuple of the same
    candidates (kept under ``key``) only the rows of the candidates whose ``CandidatePerf`` is
    another object are computed again, as ``frame`` does for the predictions. ``row`` must be
    the same function for one ``key``."""
    cache = snapshot.column_cache
    perf = snapshot.perf
    entry = cache.get(key)
    if isinstance(entry, tuple) and entry[0] is perf:
        same: FloatArray = entry[1]
        return same
    n = len(perf)
    rows: FloatArray | None = None
    if isinstance(entry, tuple) and entry[2] is snapshot.candidates and len(entry[0]) == n:
        changed = perf_changes(snapshot, entry[0])
        if len(changed) * 2 < n:
            rows = entry[1].copy()  # the last perf tuple's columns stay as they were
            rows[list(changed)] = [row(perf[i]) for i in changed]  # a list: a tuple would index dimensions
    if rows is None:
        rows = np.asarray([row(p) for p in perf], dtype=np.float64).reshape(n, width)
    cache[key] = (perf, rows, snapshot.candidates)
    return rows


def _cached(cache: MutableMapping[object, object], key: object, anchor: object, compute: Any) -> Any:
    """``compute()`` memoized under ``key`` while ``anchor`` (the snapshot part it was computed
    from) is the same object."""
    entry = cache.get(key)
    if isinstance(entry, tuple) and entry[0] is anchor:
        return entry[1]
    value = compute()
    cache[key] = (anchor, value)
    return value


def by_model(snapshot: FleetSnapshot) -> Mapping[str, IndexArray]:
    """Model name -> the indices of the candidates serving it (once per candidate tuple)."""
    def compute() -> dict[str, IndexArray]:
        found: dict[str, list[int]] = {}
        for c in snapshot.candidates:
            found.setdefault(c.deployment.name, []).append(c.index)
        return {m: np.asarray(ix, dtype=np.intp) for m, ix in found.items()}

    result: Mapping[str, IndexArray] = _cached(snapshot.column_cache, ("by-model",), snapshot.candidates, compute)
    return result


def region_members(snapshot: FleetSnapshot) -> tuple[tuple[Candidate, ...], ...] | None:
    """Per region (``snapshot.regions`` order): its candidates, when the candidate tuple is
    those runs one after the other (as the snapshot builder enumerates them), else None (once
    per candidate tuple; for plugins that judge region by region)."""
    def compute() -> tuple[tuple[Candidate, ...], ...] | None:
        members = tuple(tuple(c for c in snapshot.candidates if c.region.name == r.name) for r in snapshot.regions)
        in_order = tuple(c for group in members for c in group) == snapshot.candidates
        return members if in_order else None

    members: tuple[tuple[Candidate, ...], ...] | None = _cached(
        snapshot.column_cache, ("region-members",), snapshot.candidates, compute)
    return members


# The column-cache key of the regions' freshness as the snapshot builder judged it (``fresh_pools``).
FRESH_POOLS = ("fresh-pools",)
FreshPools = tuple[list[Mapping[str, PoolLiveState] | None], bool]


def judge_fresh(live: Mapping[str, RegionLiveState], names: Sequence[str], now: float, max_age: float) -> FreshPools:
    """Per region of ``names``: the pool mapping of its live state when that is fresh (age <=
    ``max_age``), else None; and whether every one of them is fresh and every state in
    ``live`` healthy (False also when some region's pool mapping is None)."""
    get = live.get
    pools: list[Mapping[str, PoolLiveState] | None] = [
        None if (state := get(name)) is None or now - state.observed_at > max_age else state.pools for name in names]
    return pools, None not in pools and all(map(_HEALTHY, live.values()))


_HEALTHY = attrgetter("healthy")


def fresh_pools(snapshot: FleetSnapshot) -> FreshPools:
    """``judge_fresh`` of the snapshot's live states, regions, clock and
    ``policy.max_age.region_state``: as the snapshot builder judged them for its build (kept
    in the column cache under ``FRESH_POOLS`` with the live mapping, clock, policy and regions it
    judged, so that a copy with other ones is judged again), else judged here. For the plugins
    that look at every region's freshness once per snapshot (region health, pool served)."""
    entry = snapshot.column_cache.get(FRESH_POOLS)
    if (isinstance(entry, tuple) and entry[0] is snapshot.live and entry[1] == snapshot.now
            and entry[2] is snapshot.policy and entry[3] is snapshot.regions):
        judged: FreshPools = entry[4]
        return judged
    return judge_fresh(snapshot.live, [r.name for r in snapshot.regions], snapshot.now,
                       snapshot.policy.max_age.region_state)


def region_positions(snapshot: FleetSnapshot) -> IndexArray:
    """Per candidate of the whole fleet: its region's position in ``snapshot.regions`` (once
    per candidate tuple; for plugins that judge regions and spread the verdicts)."""
    def compute() -> IndexArray:
        position = {r.name: i for i, r in enumerate(snapshot.regions)}
        return np.asarray([position[c.region.name] for c in snapshot.candidates], dtype=np.intp)

    positions: IndexArray = _cached(snapshot.column_cache, ("region-positions",), snapshot.candidates, compute)
    return positions


def frame(snapshot: FleetSnapshot, model: str, index: IndexArray) -> Frame:
    """The framework's columns restricted to ``index`` (the candidates of ``model``): once per
    perf tuple, and from the model's frame of the last perf tuple of the same candidates, only
    the candidates whose ``CandidatePerf`` is another object are computed again (the snapshot
    builder keeps the object of every candidate whose pool state did not change)."""
    cache = snapshot.column_cache
    key = ("frame", model)
    candidates = snapshot.candidates
    perf = snapshot.perf
    entry = cache.get(key)
    n = len(candidates)
    if isinstance(entry, tuple) and entry[0] is candidates:
        last: Frame = entry[2]
        if entry[1] is perf:
            return last
        if last.index is index:
            # position in this model's frame of every fleet candidate (-1: another model's)
            position: list[int] = entry[3]
            changed = [(p, i) for i in perf_changes(snapshot, entry[1]) if (p := position[i]) >= 0]
            if not changed:
                # Only other models' candidates changed: this model's frame is the last one.
                cache[key] = (candidates, perf, last, position)
                return last
            if len(changed) * 2 < len(index):
                # The last frame's static columns and RTT memo, its perf columns updated.
                updated: Frame = build_frozen(Frame, {**vars(last), **_updated(last, changed, perf, entry[1])})
                cache[key] = (candidates, perf, updated, position)
                return updated
    columns = _perf_columns([perf[i] for i in index.tolist()])
    static = _cached(cache, ("frame-static",), candidates, lambda: _static(candidates))
    # Per model: the static columns and the RTT memo (while the candidates stay).
    def restrict_static() -> tuple[dict[str, Any], dict[tuple[float, float], FloatArray]]:
        return {name: column[index] for name, column in static.items()}, {}

    static_columns, rtt_memo = (_cached(cache, ("frame-static", model), candidates, restrict_static) if len(index)
                                else restrict_static())
    result = build_frozen(Frame, {"model": model, "index": index, **static_columns, **columns, "rtt_memo": rtt_memo})
    if len(index):  # a model nobody serves (any name a client sends) is not worth a cache entry
        cache[key] = (candidates, perf, result, _positions(index, n))
    return result


def _positions(index: IndexArray, n: int) -> list[int]:
    """Per candidate of the fleet (``n``): its position in ``index``, or -1."""
    position = [-1] * n
    for p, i in enumerate(index.tolist()):
        position[i] = p
    return position


def whole(index: IndexArray, n: int) -> bool:
    """Whether ``index`` (ascending, distinct candidate indices: a model's, ``by_model``) is
    every one of the ``n`` candidates, when restricting to it would copy the columns unchanged."""
    return len(index) == n


def anchor(plugin: Prepares, snapshot: FleetSnapshot) -> object:
    """The snapshot part the plugin's columns are computed from (its ``LIFETIME``)."""
    lifetime = plugin.LIFETIME
    if lifetime == "static":
        return snapshot.candidates
    if lifetime == "perf":
        return snapshot.perf
    return snapshot.live_key


def prepared(plugin: Prepares, snapshot: FleetSnapshot, model: str, index: IndexArray) -> Any:
    """The plugin's columns for the candidates at ``index`` (those of ``model``), computed
    once per ``LIFETIME`` and restricted once per model."""
    if plugin.LIFETIME is None:
        return None
    cache = snapshot.column_cache
    at = anchor(plugin, snapshot)
    key = ("plugin", id(plugin), model)
    entry = cache.get(key)
    # The plugin object is kept in the entry, so its id cannot be reused while it is there.
    if isinstance(entry, tuple) and entry[0] is plugin and entry[1] is at:
        return entry[2]
    columns = fleet_columns(plugin, snapshot, at)
    n = len(snapshot.candidates)
    if whole(index, n):
        restricted = columns
    elif isinstance(entry, tuple) and entry[0] is plugin and entry[3] is columns and entry[4] is index:
        # prepare gave the very columns it gave before (a plugin may keep them while its
        # inputs are unchanged): so is their restriction
        restricted = entry[2]
    else:
        restricted = restrict(columns, index, n)
    if len(index):  # as in ``frame``: no entry per unserved model name
        cache[key] = (plugin, at, restricted, columns, index)
    return restricted


def fleet_columns(plugin: Prepares, snapshot: FleetSnapshot, at: object) -> Any:
    """The plugin's columns for the whole fleet, prepared once per ``at`` (the snapshot part
    they are computed from, ``anchor``) and shared by every model's requests."""
    cache = snapshot.column_cache
    full_key = ("plugin", id(plugin))
    full = cache.get(full_key)
    # The plugin object is kept in the entry, so its id cannot be reused while it is there.
    if isinstance(full, tuple) and full[0] is plugin and full[1] is at:
        return full[2]
    columns = plugin.prepare(snapshot)
    cache[full_key] = (plugin, at, columns)
    return columns


def restrict(columns: Any, index: IndexArray, n: int) -> Any:
    """The columns at ``index``: every per-candidate array (length ``n``) and every mapping of
    them is indexed; other fields are kept."""
    if columns is None or not dataclasses.is_dataclass(columns) or isinstance(columns, type):
        return columns
    names = _FIELDS.get(type(columns))
    if names is None:
        names = _FIELDS[type(columns)] = tuple(f.name for f in dataclasses.fields(columns))
    changes: dict[str, Any] = {}
    for name in names:
        value = getattr(columns, name)
        if isinstance(value, np.ndarray):
            if value.ndim >= 1 and len(value) == n:
                changes[name] = value[index]
        elif isinstance(value, Mapping) and value and all(
            isinstance(v, np.ndarray) and len(v) == n for v in value.values()
        ):
            changes[name] = {k: v[index] for k, v in value.items()}
    return dataclasses.replace(columns, **changes) if changes else columns


# Columns class -> its dataclass field names (restrict reads them for every live column).
_FIELDS: dict[type, tuple[str, ...]] = {}


def memo(snapshot: FleetSnapshot, key: object, anchor: object, compute: Any) -> Any:
    """A bounded memo in the snapshot's cache (e.g. RTT rows per client location)."""
    cache = snapshot.column_cache
    if len(cache) >= _MEMO_LIMIT:
        cache.clear()
    return _cached(cache, key, anchor, compute)
