"""The snapshot as columns: the framework's own per-candidate facts, and how a plugin's
columns are restricted to a model's candidates.

A decision touches every candidate that serves the model several times (filters, the
predictions, the scorers). Done per candidate in Python that costs ~3 us per candidate; as
numpy columns it costs ~1 us per operation whatever the fleet size.

The framework's columns (``Frame``) are the candidate index by model, each candidate's
region, location and tie-break key, a memo of RTT rows per client location, and the
prediction matrix from each candidate's ``CandidatePerf``. They are built here from scratch
(``frame``) or from the last frame of the same candidates with only the rows of the
candidates whose ``CandidatePerf`` changed computed again (``updated_frame``); which frame is
kept across snapshots is the framework's state (scheduler.framework.state). A plugin's
columns name the fields that hold one value per candidate (``PER_CANDIDATE``): ``restrict``
indexes those alone.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import numpy.typing as npt

from scheduler.types import (
    Candidate,
    CandidatePerf,
    FleetSnapshot,
    FreshPools,
    build_frozen,
    judge_fresh,
)

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]
HashArray = npt.NDArray[np.uint64]

# The request features every prediction is linear in (scheduler.framework.predict):
# 1, uncached prompt tokens U, attention pairs U x (prompt - U / 2), mid-output context
# prompt + N / 2, output tokens N, and N x mid-output context.
REQUEST_FEATURES = ("one", "uncached", "pairs", "mid_context", "out", "out_x_mid_context")
PREDICTIONS = ("energy_j", "ttft_s_without_rtt", "tpot_s")


class PerCandidate(Protocol):
    """Columns a plugin prepares: the names of its fields that hold one value per candidate
    (a numpy array, or a mapping of such arrays), which ``restrict`` indexes."""

    PER_CANDIDATE: ClassVar[tuple[str, ...]]


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
    # one memo per candidate tuple and model, shared by the frames of every perf tuple
    # (``updated_frame`` hands it on).
    rtt_memo: dict[tuple[float, float], FloatArray] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)
    # fleet candidate index -> its position in ``index`` (handed on with the static columns)
    positions: dict[int, int] = dataclasses.field(default_factory=dict, compare=False, repr=False)


def _col(values: list[float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def static_columns(candidates: tuple[Candidate, ...]) -> dict[str, Any]:
    """The candidates' region index, location and tie-break key (``Frame`` layout): once per
    fleet (scheduler.framework.state)."""
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


def frame(snapshot: FleetSnapshot, model: str, index: IndexArray,
          static: Mapping[str, Any] | None = None) -> Frame:
    """The framework's columns for the candidates at ``index`` (those of ``model``), from
    scratch (``static``: the fleet's ``static_columns``, when already made)."""
    fleet_static = static_columns(snapshot.candidates) if static is None else static
    perf = snapshot.perf
    return build_frozen(Frame, {"model": model, "index": index,
                                **{name: column[index] for name, column in fleet_static.items()},
                                **_perf_columns([perf[i] for i in index.tolist()]), "rtt_memo": {},
                                "positions": {i: p for p, i in enumerate(index.tolist())}})


def updated_frame(last: Frame, perf: tuple[CandidatePerf, ...], previous: tuple[CandidatePerf, ...],
                  changed: Sequence[int] | None) -> Frame:
    """``last`` (computed from the perf tuple ``previous``) brought up to ``perf``: only the rows
    of the fleet candidates ``changed`` computed again when they are few (None: not known, all
    of them), its static columns and RTT memo handed on. ``last`` itself when none of its
    candidates changed."""
    index = last.index
    if changed is not None:
        position = last.positions
        moved = [(p, i) for i in changed if (p := position.get(i)) is not None]
        if not moved:
            return last
        if len(moved) * 2 < len(index):
            return build_frozen(Frame, {**vars(last), **_updated(last, moved, perf, previous)})
    return build_frozen(Frame, {**vars(last), **_perf_columns([perf[i] for i in index.tolist()])})


def perf_column(snapshot: FleetSnapshot, last: FloatArray | None, value: Callable[[CandidatePerf], float]) -> FloatArray:
    """``value`` of every candidate's ``CandidatePerf``: from ``last`` (the column of the
    delta's previous build, as a plugin's ``update`` gets it) computed again only at the
    candidates whose ``CandidatePerf`` changed (``SnapshotDelta.perf``) while they are few."""
    perf, delta = snapshot.perf, snapshot.delta
    if last is None or delta is None or len(delta.perf) * 2 >= len(perf):
        return np.asarray([value(p) for p in perf], dtype=np.float64)
    column = last.copy()  # the last build's columns stay as they were
    changed = list(delta.perf)  # a list: a tuple would index dimensions
    column[changed] = [value(perf[i]) for i in changed]
    return column


def by_model(candidates: tuple[Candidate, ...]) -> dict[str, IndexArray]:
    """Model name -> the indices of the candidates serving it."""
    found: dict[str, list[int]] = {}
    for c in candidates:
        found.setdefault(c.deployment.name, []).append(c.index)
    return {m: np.asarray(ix, dtype=np.intp) for m, ix in found.items()}


def region_positions(snapshot: FleetSnapshot) -> IndexArray:
    """Per candidate of the whole fleet: its region's position in ``snapshot.regions`` (for
    plugins that judge regions and spread the verdicts)."""
    position = {r.name: i for i, r in enumerate(snapshot.regions)}
    return np.asarray([position[c.region.name] for c in snapshot.candidates], dtype=np.intp)


def fresh_pools(snapshot: FleetSnapshot) -> FreshPools:
    """``judge_fresh`` of the snapshot's live states, regions, clock and
    ``policy.max_age.region_state``: as the snapshot builder judged them (``SnapshotDelta``)
    when the snapshot is as it built it, else judged here."""
    delta = snapshot.delta
    if delta is not None and delta.judged(snapshot):
        return list(delta.fresh_pools), delta.all_fresh_and_healthy
    return judge_fresh(snapshot.live, [r.name for r in snapshot.regions], snapshot.now,
                       snapshot.policy.max_age.region_state)


def restrict(columns: Any, index: IndexArray) -> Any:
    """The columns at ``index``: the fields the columns class names ``PER_CANDIDATE`` (arrays,
    or mappings of arrays) indexed, every other field kept."""
    names: tuple[str, ...] = getattr(columns, "PER_CANDIDATE", ())
    if not names:
        return columns
    changes: dict[str, Any] = {}
    for name in names:
        value = getattr(columns, name)
        if isinstance(value, Mapping):
            changes[name] = {k: v[index] for k, v in value.items()}
        elif value is not None:
            changes[name] = value[index]
    return dataclasses.replace(columns, **changes)
