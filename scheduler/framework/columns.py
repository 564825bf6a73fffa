"""The snapshot as columns: the framework's own per-candidate facts, and the cache of every
plugin's prepared columns.

A decision touches every candidate that serves the model several times (filters, the
predictions, the scorers). Done per candidate in Python that costs ~3 us per candidate; as
numpy columns it costs ~1 us per operation whatever the fleet size.

The framework's columns (``Frame``) are the candidate index by model, each candidate's
region, location and tie-break key, and a memo of RTT rows per client location (static: once
per candidate tuple) and the prediction matrix from each candidate's ``CandidatePerf`` (once
per perf tuple, which the snapshot builder reuses while no pool's live state changes; a new
perf tuple recomputes only the rows of the candidates whose ``CandidatePerf`` changed). A plugin's columns come from its
``prepare`` and live as long as its ``LIFETIME`` says (``live``: as long as the snapshot's
``live_key``, which the snapshots that differ only in pending dispatches share). All of them are kept in the
snapshot's ``column_cache`` (shared by the snapshots of one builder), each entry with the
snapshot part it was computed from, and restricted once per model to that model's
candidates: every request for a model starts from them.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from itertools import compress
from operator import is_not
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, build_frozen

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
        # EnergyCoefficients.joules: ... + (N - 1) (step_j + step_j_per_context_token x mid)
        (e.start_j - e.step_j, e.prefill_j_per_token, e.prefill_j_per_pair, -e.step_j_per_context_token, e.step_j,
         e.step_j_per_context_token),
        # queue wait + LatencyCoefficients prefill
        (p.queue_wait_s + t.prefill_s, t.prefill_s_per_token, t.prefill_s_per_pair, 0.0, 0.0, 0.0),
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


def _rows_of(index: IndexArray, n: int) -> IndexArray:
    """The rows of ``Frame.prediction`` (fleet layout, ``n`` candidates) of the candidates at ``index``."""
    rows: IndexArray = np.concatenate([index + k * n for k in range(len(PREDICTIONS))])
    return rows


def _perf(perf: tuple[CandidatePerf, ...], last: tuple[tuple[CandidatePerf, ...], dict[str, Any]] | None) -> dict[str, Any]:
    """The fleet's perf columns; from ``last`` (an earlier perf tuple of the same candidates and
    its columns) only the candidates whose ``CandidatePerf`` is another object are recomputed
    (the snapshot builder keeps the object of every candidate whose pool state did not change)."""
    n = len(perf)
    if last is not None and len(last[0]) == n:
        previous, columns = last
        changed = list(compress(range(n), map(is_not, perf, previous)))
        if len(changed) * 2 < n:
            if not changed:
                return columns
            prediction = columns["prediction"].copy()
            queue_wait_s = columns["queue_wait_s"].copy()
            live = columns["live"].copy()
            changed_perf = [perf[i] for i in changed]
            coefficients = [_coefficients(p) for p in changed_perf]
            # rows k x n + i, PREDICTIONS-major, as in ``Frame.prediction``
            prediction[[k * n + i for k in range(len(PREDICTIONS)) for i in changed]] = [
                c[k] for k in range(len(PREDICTIONS)) for c in coefficients]
            queue_wait_s[changed] = [p.queue_wait_s for p in changed_perf]
            live[changed] = [p.live for p in changed_perf]
            return {"prediction": prediction, "queue_wait_s": queue_wait_s, "live": live}
    return {
        "prediction": _prediction_block(list(perf)),
        "queue_wait_s": _col([p.queue_wait_s for p in perf]),
        "live": np.asarray([p.live for p in perf], dtype=bool),
    }


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


def region_positions(snapshot: FleetSnapshot) -> IndexArray:
    """Per candidate of the whole fleet: its region's position in ``snapshot.regions`` (once
    per candidate tuple; for plugins that judge regions and spread the verdicts)."""
    def compute() -> IndexArray:
        position = {r.name: i for i, r in enumerate(snapshot.regions)}
        return np.asarray([position[c.region.name] for c in snapshot.candidates], dtype=np.intp)

    positions: IndexArray = _cached(snapshot.column_cache, ("region-positions",), snapshot.candidates, compute)
    return positions


def frame(snapshot: FleetSnapshot, model: str, index: IndexArray) -> Frame:
    """The framework's columns restricted to ``index`` (the candidates of ``model``)."""
    cache = snapshot.column_cache
    key = ("frame", model)
    entry = cache.get(key)
    if isinstance(entry, tuple) and entry[0] is snapshot.candidates and entry[1] is snapshot.perf:
        result: Frame = entry[2]
        return result
    candidates = snapshot.candidates
    n = len(candidates)
    static = _cached(cache, ("frame-static",), candidates, lambda: _static(candidates))
    # Per model: the static columns, the prediction columns and the RTT memo (while the candidates stay).
    def restrict_static() -> tuple[dict[str, Any], IndexArray, dict[tuple[float, float], FloatArray]]:
        return {name: column[index] for name, column in static.items()}, _rows_of(index, n), {}

    restricted = (_cached(cache, ("frame-static", model), candidates, restrict_static) if len(index)
                  else restrict_static())
    last = cache.get(("frame-perf",))
    if isinstance(last, tuple) and last[0] is snapshot.perf:
        perf = last[1]
    else:
        previous = last if isinstance(last, tuple) and len(last) == 3 and last[2] is candidates else None
        perf = _perf(snapshot.perf, None if previous is None else (previous[0], previous[1]))
        cache[("frame-perf",)] = (snapshot.perf, perf, candidates)
    static_columns, prediction_rows, rtt_memo = restricted
    result = build_frozen(Frame, {
        "model": model,
        "index": index,
        **static_columns,
        "prediction": perf["prediction"][prediction_rows],
        "queue_wait_s": perf["queue_wait_s"][index],
        "live": perf["live"][index],
        "rtt_memo": rtt_memo,
    })
    if len(index):  # a model nobody serves (any name a client sends) is not worth a cache entry
        cache[key] = (snapshot.candidates, snapshot.perf, result)
    return result


def _anchor(plugin: Prepares, snapshot: FleetSnapshot) -> object:
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
    anchor = _anchor(plugin, snapshot)
    key = ("plugin", id(plugin), model)
    entry = cache.get(key)
    # The plugin object is kept in the entry, so its id cannot be reused while it is there.
    if isinstance(entry, tuple) and entry[0] is plugin and entry[1] is anchor:
        return entry[2]
    full_key = ("plugin", id(plugin))
    full = cache.get(full_key)
    if isinstance(full, tuple) and full[0] is plugin and full[1] is anchor:
        columns = full[2]
    else:
        columns = plugin.prepare(snapshot)
        cache[full_key] = (plugin, anchor, columns)
    if isinstance(entry, tuple) and entry[0] is plugin and entry[3] is columns and entry[4] is index:
        # prepare gave the very columns it gave before (a plugin may keep them while its
        # inputs are unchanged): so is their restriction
        restricted = entry[2]
    else:
        restricted = restrict(columns, index, len(snapshot.candidates))
    if len(index):  # as in ``frame``: no entry per unserved model name
        cache[key] = (plugin, anchor, restricted, columns, index)
    return restricted


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
