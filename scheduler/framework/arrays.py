"""The snapshot as columns: one numpy array per per-candidate fact, built once per snapshot.

A decision touches every candidate that serves the model several times (filters, the
estimates, five scorers). Done per candidate in Python that costs ~3 us per candidate; as
columns it costs ~1 us per operation whatever the fleet size, which is what keeps a
12-region x 4-pool decision in tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler.energy.models import PRECISION_RANK
from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, GeoPoint, PoolLiveState, RegionLiveState

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]

FIBRE_KM_PER_S = 200_000.0
# Real fibre routes run longer than the great circle.
ROUTE_FACTOR = 1.4
BASE_RTT_S = 0.002
EARTH_KM = 6371.0
_RTT_MEMO_LIMIT = 4096
_IDLE = PoolLiveState()


@dataclass(frozen=True)
class FleetArrays:
    by_model: Mapping[str, IndexArray]
    jurisdiction: Mapping[str, BoolArray]
    certification: Mapping[str, BoolArray]
    precision_rank: FloatArray
    kv_capacity: FloatArray
    max_context: FloatArray
    hbm_gb: FloatArray
    pue: FloatArray
    price_per_kwh: FloatArray
    lat_rad: FloatArray
    lon_rad: FloatArray
    # live-dependent (from each candidate's CandidatePerf)
    queue_wait_s: FloatArray
    # candidate x (energy_j, ttft_s without RTT, tpot_s) x REQUEST_FEATURES: every
    # per-request prediction is linear in the features, so one matrix product gives them all
    # (scheduler.framework.latency.request_view).
    prediction: FloatArray
    # The region's live state judged per policy.unknown_region_state (the data layer's reading
    # of live state; the health filter applies it): None = may take requests, else why not.
    health: tuple[tuple[str, tuple[object, ...]] | None, ...]
    healthy: BoolArray
    # carbon: grams per joule (intensity x PUE / 3.6e6) and the signal's age (inf: none)
    carbon_g_per_j: FloatArray
    carbon_age_s: FloatArray
    # load in [0, 1] per candidate, and whether its region state is fresh
    load: FloatArray
    load_fresh: BoolArray
    _cache: ColumnCache = field(repr=False)
    _perf_identity: tuple[CandidatePerf, ...] = field(repr=False)
    _rtt_memo: dict[tuple[float, float], FloatArray] = field(default_factory=dict, repr=False)
    _pools_lacking: dict[str, tuple[Candidate, ...]] = field(default_factory=dict, repr=False)
    _restricted: dict[str, FleetArrays] = field(default_factory=dict, repr=False)

    def restricted(self, model: str, index: IndexArray) -> FleetArrays:
        """These columns restricted to the candidates at ``index`` (memoized under ``model``:
        every request for a model starts from the same candidates; the static and perf
        columns' restriction is shared across the builder's snapshots)."""
        cols = self._restricted.get(model)
        if cols is None:
            columns = {f.name: getattr(self, f.name) for f in fields(self) if f.init and not f.name.startswith("_")}
            cols = FleetArrays(
                **self._cache.restricted(model, self._perf_identity, index, columns),  # type: ignore[arg-type]
                **{name: _restrict(columns[name], index) for name in LIVE_FIELDS},
                _cache=self._cache,
                _perf_identity=self._perf_identity,
            )
            self._restricted[model] = cols
        return cols

    def pools_lacking(self, snapshot: FleetSnapshot, model: str) -> tuple[Candidate, ...]:
        """The first candidate of each pool that serves no deployment of ``model``."""
        lacking = self._pools_lacking.get(model)
        if lacking is None:
            lacking = tuple(pool[0] for pool in snapshot.pools if not any(c.deployment.name == model for c in pool))
            if len(self._pools_lacking) < _RTT_MEMO_LIMIT:
                self._pools_lacking[model] = lacking
        return lacking

    def rtt_s(self, client: GeoPoint | None) -> FloatArray | None:
        """Round-trip time from ``client`` to each candidate's region (None: no location)."""
        if client is None:
            return None
        key = (client.lat, client.lon)
        row = self._rtt_memo.get(key)
        if row is None:
            if len(self._rtt_memo) >= _RTT_MEMO_LIMIT:
                self._rtt_memo.clear()
            lat, lon = np.radians(client.lat), np.radians(client.lon)
            a = np.sin((self.lat_rad - lat) / 2) ** 2 + np.cos(lat) * np.cos(self.lat_rad) * np.sin(
                (self.lon_rad - lon) / 2
            ) ** 2
            km = 2 * EARTH_KM * np.arcsin(np.sqrt(a))
            row = 2 * km * ROUTE_FACTOR / FIBRE_KM_PER_S + BASE_RTT_S
            self._rtt_memo[key] = row
        return row


STATIC_FIELDS = ("by_model", "jurisdiction", "certification", "precision_rank", "kv_capacity", "max_context",
                 "hbm_gb", "pue", "price_per_kwh", "lat_rad", "lon_rad")
PERF_FIELDS = ("queue_wait_s", "prediction")
LIVE_FIELDS = ("health", "healthy", "carbon_g_per_j", "carbon_age_s", "load", "load_fresh")
_RESTRICTED_MEMO_LIMIT = 256


@dataclass
class ColumnCache:
    """Columns that outlive one snapshot, shared by the snapshots of one ``SnapshotBuilder``:
    the candidates' static facts (once), the columns of the last ``perf`` tuple (rebuilt
    only when the builder made a new one) and their per-model restrictions. A cache only:
    every value is a function of the snapshot it is read for."""

    _static: tuple[tuple[Candidate, ...], dict[str, Any]] | None = None
    _perf: tuple[tuple[CandidatePerf, ...], dict[str, Any]] | None = None
    # (model, id(perf)) -> (perf, its restricted columns); perf is kept so the id stays its own.
    _restricted: dict[tuple[str, int], tuple[tuple[CandidatePerf, ...], dict[str, Any]]] = field(
        default_factory=dict)

    def static(self, candidates: tuple[Candidate, ...]) -> dict[str, Any]:
        if self._static is None or self._static[0] is not candidates:
            self._static = (candidates, _static_columns(candidates))
            self._restricted.clear()
        return self._static[1]

    def perf(self, perf: tuple[CandidatePerf, ...]) -> dict[str, Any]:
        if self._perf is None or self._perf[0] is not perf:
            self._perf = (perf, _perf_columns(perf))
        return self._perf[1]

    def restricted(self, model: str, perf: tuple[CandidatePerf, ...], index: IndexArray,
                   columns: dict[str, Any]) -> dict[str, Any]:
        key = (model, id(perf))
        entry = self._restricted.get(key)
        if entry is None or entry[0] is not perf:
            if len(self._restricted) >= _RESTRICTED_MEMO_LIMIT:
                self._restricted.clear()
            cached = {name: _restrict(columns[name], index) for name in (*STATIC_FIELDS, *PERF_FIELDS)
                      if name != "by_model"}
            cached["by_model"] = {}
            entry = (perf, cached)
            self._restricted[key] = entry
        return entry[1]


def _restrict(value: Any, index: IndexArray) -> Any:
    if isinstance(value, np.ndarray):
        return value[index]
    if isinstance(value, tuple):
        return tuple(value[i] for i in index.tolist())
    assert isinstance(value, dict)
    return {k: v[index] for k, v in value.items()}


def build_arrays(snapshot: FleetSnapshot, cache: ColumnCache | None = None) -> FleetArrays:
    cache = cache or ColumnCache()
    return FleetArrays(
        **cache.static(snapshot.candidates),  # type: ignore[arg-type]
        **cache.perf(snapshot.perf),
        **_live_columns(snapshot),
        _cache=cache,
        _perf_identity=snapshot.perf,
    )


def _col(values: list[float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def _static_columns(cands: tuple[Candidate, ...]) -> dict[str, Any]:
    by_model: dict[str, list[int]] = {}
    for c in cands:
        by_model.setdefault(c.deployment.name, []).append(c.index)
    jurisdictions = {c.region.jurisdiction for c in cands}
    certifications = {cert for c in cands for cert in c.region.certifications}
    return {
        "by_model": {m: np.asarray(ix, dtype=np.intp) for m, ix in by_model.items()},
        "jurisdiction": {j: np.asarray([c.region.jurisdiction == j for c in cands]) for j in jurisdictions},
        "certification": {k: np.asarray([k in c.region.certifications for c in cands]) for k in certifications},
        "precision_rank": _col([PRECISION_RANK[c.deployment.precision] for c in cands]),
        "kv_capacity": _col([c.kv_capacity_tokens for c in cands]),
        "max_context": _col([c.deployment.max_context for c in cands]),
        "hbm_gb": _col([c.gpu.hbm_gb for c in cands]),
        "pue": _col([c.region.pue for c in cands]),
        "price_per_kwh": _col([c.region.price_per_kwh for c in cands]),
        "lat_rad": np.radians(_col([c.region.location.lat for c in cands])),
        "lon_rad": np.radians(_col([c.region.location.lon for c in cands])),
    }


# The request features the predictions are linear in (scheduler.framework.latency):
# 1, uncached prompt tokens, attention pairs uncached x (prompt - uncached / 2),
# mid-output context prompt + N / 2, output tokens N, and N x mid-output context.
REQUEST_FEATURES = ("one", "uncached", "pairs", "mid_context", "out", "out_x_mid_context")


def _perf_columns(perf: tuple[CandidatePerf, ...]) -> dict[str, Any]:
    rows = []
    for p in perf:
        e = p.energy
        rows.append((
            # EnergyCoefficients.joules: e_start + e_idle x wait + uncached x e_prefill
            #                            + N x e_step + N x mid x e_step_per_context
            (e.start_j + e.idle_w * p.queue_wait_s, e.prefill_j_per_token, 0.0, 0.0, e.step_j,
             e.step_j_per_context_token),
            # TTFT without RTT: queue wait + uncached x prefill_s_per_token + pairs x prefill_s_per_pair
            (p.queue_wait_s, p.prefill_s_per_token, p.prefill_s_per_attention_pair, 0.0, 0.0, 0.0),
            # TPOT: decode step + mid x decode step per context token
            (p.decode_step_s, 0.0, 0.0, p.decode_step_s_per_context, 0.0, 0.0),
        ))
    return {
        "queue_wait_s": _col([p.queue_wait_s for p in perf]),
        "prediction": np.asarray(rows, dtype=np.float64).reshape(len(perf), 3, len(REQUEST_FEATURES)),
    }


def _live_columns(snapshot: FleetSnapshot) -> dict[str, Any]:
    """Health, carbon and load: judged once per region (or zone), spread to its candidates."""
    verdicts: dict[str, tuple[str, tuple[object, ...]] | None] = {}
    carbon: dict[str, tuple[float, float]] = {}
    fresh: dict[str, RegionLiveState | None] = {}
    for region in snapshot.regions:
        verdicts[region.name] = _health(snapshot, region.name)
        fresh[region.name] = snapshot.fresh_live(region.name)
        signal = snapshot.carbon.get(region.grid_zone)
        carbon[region.name] = (
            (0.0, np.inf) if signal is None else (signal.value * region.pue / 3.6e6, snapshot.now - signal.observed_at)
        )
    cands = snapshot.candidates
    names = [c.region.name for c in cands]
    health = tuple(verdicts[n] for n in names)
    load, load_fresh = [], []
    for c, name in zip(cands, names, strict=True):
        state = fresh[name]
        load_fresh.append(state is not None)
        if state is None:
            load.append(0.0)
            continue
        pool = state.pools.get(c.pool.name, _IDLE)
        replicas = max(1, c.pool.count // c.deployment.tensor_parallel)
        load.append(0.5 * pool.kv_cache_usage + 0.5 * min(1.0, pool.queue_depth / replicas / 4.0))
    return {
        "health": health,
        "healthy": np.asarray([h is None for h in health], dtype=bool),
        "carbon_g_per_j": _col([carbon[n][0] for n in names]),
        "carbon_age_s": _col([carbon[n][1] for n in names]),
        "load": _col(load),
        "load_fresh": np.asarray(load_fresh, dtype=bool),
    }


def _health(snapshot: FleetSnapshot, region: str) -> tuple[str, tuple[object, ...]] | None:
    """None when the region may take requests, else why not (policy.unknown_region_state
    decides for stale and never-seen regions)."""
    unknown = snapshot.policy.unknown_region_state
    state = snapshot.live.get(region)
    if state is None:
        return None if unknown.missing == "assume-healthy" else ("no live state ever seen", ())
    age = snapshot.now - state.observed_at
    max_age = snapshot.policy.max_age.region_state
    if age > max_age:
        return None if unknown.stale == "assume-healthy" else ("live state {:.1f} s old > limit {:.1f} s", (age, max_age))
    return None if state.healthy else ("region reports unhealthy", ())
