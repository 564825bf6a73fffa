"""The snapshot as columns: one numpy array per per-candidate fact.

A decision touches every candidate that serves the model several times (filters, the
predictions, five scorers). Done per candidate in Python that costs ~3 us per candidate;
as columns it costs ~1 us per operation whatever the fleet size, which is what keeps a
12-region x 4-pool decision in tens of microseconds.

Columns come in three lifetimes, and only the last is built per snapshot:
- static (the candidates' configured facts): once per ``SnapshotBuilder``;
- perf (from each candidate's ``CandidatePerf``): once per ``perf`` tuple, which the builder
  reuses while no pool's live state changes;
- live (health, carbon, load): per snapshot, judged once per region and spread to its
  candidates.
``ColumnCache`` keeps the first two, their per-model restrictions and the RTT rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from scheduler.energy.models import PRECISION_RANK
from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, GeoPoint, PoolLiveState

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IndexArray = npt.NDArray[np.intp]

FIBRE_KM_PER_S = 200_000.0
# Real fibre routes run longer than the great circle.
ROUTE_FACTOR = 1.4
BASE_RTT_S = 0.002
EARTH_KM = 6371.0
_MEMO_LIMIT = 4096
_IDLE = PoolLiveState()
# The request features the predictions are linear in (scheduler.framework.latency):
# 1, uncached prompt tokens, attention pairs uncached x (prompt - uncached / 2),
# mid-output context prompt + N / 2, output tokens N, and N x mid-output context.
REQUEST_FEATURES = ("one", "uncached", "pairs", "mid_context", "out", "out_x_mid_context")

Verdict = tuple[str, tuple[object, ...]] | None


@dataclass(frozen=True)
class FleetArrays:
    """Per-candidate columns, for the whole fleet (``scope`` "") or restricted to the
    candidates of one model (``scope`` = the model name; then row p is ``base[p]``)."""

    scope: str
    # static
    by_model: Mapping[str, IndexArray]
    # candidate -> its region's position in region_names (the order of snapshot.regions)
    region_names: tuple[str, ...]
    region_index: IndexArray
    jurisdiction: Mapping[str, BoolArray]
    certification: Mapping[str, BoolArray]
    precision_rank: FloatArray
    kv_capacity: FloatArray
    hbm_gb: FloatArray
    pue: FloatArray
    price_per_kwh: FloatArray
    lat_rad: FloatArray
    lon_rad: FloatArray
    # perf (from each candidate's CandidatePerf)
    queue_wait_s: FloatArray
    # candidate x (energy_j, ttft_s without RTT, tpot_s) x REQUEST_FEATURES: every
    # per-request prediction is linear in the features, so one matrix product gives them all.
    prediction: FloatArray
    # live: the region's live state judged per policy.unknown_region_state (None: may take
    # requests, else why not), indexed by region; the health filter applies it.
    region_health: tuple[Verdict, ...]
    healthy: BoolArray
    # grams per joule (intensity x PUE / 3.6e6) and the carbon signal's age (inf: none)
    carbon_g_per_j: FloatArray
    carbon_age_s: FloatArray
    # load in [0, 1] per candidate, and whether its region state is fresh
    load: FloatArray
    load_fresh: BoolArray
    cache: ColumnCache = field(repr=False, compare=False)
    perf_identity: tuple[CandidatePerf, ...] = field(repr=False, compare=False)
    _restricted: dict[str, FleetArrays] = field(default_factory=dict, repr=False, compare=False)

    def health(self, row: int) -> Verdict:
        return self.region_health[int(self.region_index[row])]

    def restricted(self, model: str, index: IndexArray) -> FleetArrays:
        """These columns restricted to the candidates at ``index`` (the model's candidates:
        every request for a model starts from them)."""
        cols = self._restricted.get(model)
        if cols is None:
            static_perf = self.cache.restricted(model, self, index)
            cols = FleetArrays(
                scope=model,
                **static_perf,
                region_health=self.region_health,
                healthy=self.healthy[index],
                carbon_g_per_j=self.carbon_g_per_j[index],
                carbon_age_s=self.carbon_age_s[index],
                load=self.load[index],
                load_fresh=self.load_fresh[index],
                cache=self.cache,
                perf_identity=self.perf_identity,
            )
            self._restricted[model] = cols
        return cols

    def rtt_s(self, client: GeoPoint | None) -> FloatArray | None:
        """Round-trip time from ``client`` to each candidate's region (None: no location)."""
        if client is None:
            return None
        return self.cache.rtt(self.scope, client, self.lat_rad, self.lon_rad)


@dataclass
class ColumnCache:
    """Columns that outlive one snapshot, shared by the snapshots of one ``SnapshotBuilder``.
    A cache only: every value is a function of the snapshot it is read for."""

    _static: tuple[tuple[Candidate, ...], dict[str, Any]] | None = None
    _perf: tuple[tuple[CandidatePerf, ...], dict[str, Any]] | None = None
    # (model, id(perf)) -> (perf, its restricted columns); perf is kept so the id stays its own.
    _restricted: dict[tuple[str, int], tuple[tuple[CandidatePerf, ...], dict[str, Any]]] = field(
        default_factory=dict)
    _rtt: dict[tuple[str, float, float], FloatArray] = field(default_factory=dict)
    _lacking: dict[str, tuple[Candidate, ...]] = field(default_factory=dict)

    def static(self, candidates: tuple[Candidate, ...]) -> dict[str, Any]:
        if self._static is None or self._static[0] is not candidates:
            self._static = (candidates, _static_columns(candidates))
            self._restricted.clear()
            self._rtt.clear()
            self._lacking.clear()
        return self._static[1]

    def perf(self, perf: tuple[CandidatePerf, ...]) -> dict[str, Any]:
        if self._perf is None or self._perf[0] is not perf:
            self._perf = (perf, _perf_columns(perf))
        return self._perf[1]

    def restricted(self, model: str, full: FleetArrays, index: IndexArray) -> dict[str, Any]:
        key = (model, id(full.perf_identity))
        entry = self._restricted.get(key)
        if entry is None or entry[0] is not full.perf_identity:
            if len(self._restricted) >= 256:
                self._restricted.clear()
            columns: dict[str, Any] = {
                "by_model": {},
                "region_names": full.region_names,
                "jurisdiction": {k: mask[index] for k, mask in full.jurisdiction.items()},
                "certification": {k: mask[index] for k, mask in full.certification.items()},
            }
            for name in ("region_index", "precision_rank", "kv_capacity", "hbm_gb", "pue", "price_per_kwh",
                         "lat_rad", "lon_rad", "queue_wait_s", "prediction"):
                columns[name] = getattr(full, name)[index]
            entry = (full.perf_identity, columns)
            self._restricted[key] = entry
        return entry[1]

    def rtt(self, scope: str, client: GeoPoint, lat_rad: FloatArray, lon_rad: FloatArray) -> FloatArray:
        key = (scope, client.lat, client.lon)
        row = self._rtt.get(key)
        if row is None:
            if len(self._rtt) >= _MEMO_LIMIT:
                self._rtt.clear()
            lat, lon = np.radians(client.lat), np.radians(client.lon)
            a = np.sin((lat_rad - lat) / 2) ** 2 + np.cos(lat) * np.cos(lat_rad) * np.sin((lon_rad - lon) / 2) ** 2
            km = 2 * EARTH_KM * np.arcsin(np.sqrt(a))
            row = 2 * km * ROUTE_FACTOR / FIBRE_KM_PER_S + BASE_RTT_S
            self._rtt[key] = row
        return row

    def pools_lacking(self, snapshot: FleetSnapshot, model: str) -> tuple[Candidate, ...]:
        """The first candidate of each pool that serves no deployment of ``model``."""
        lacking = self._lacking.get(model)
        if lacking is None:
            lacking = tuple(pool[0] for pool in snapshot.pools if not any(c.deployment.name == model for c in pool))
            if len(self._lacking) < _MEMO_LIMIT:
                self._lacking[model] = lacking
        return lacking


def build_arrays(snapshot: FleetSnapshot, cache: ColumnCache | None = None) -> FleetArrays:
    cache = cache or ColumnCache()
    static = cache.static(snapshot.candidates)
    return FleetArrays(
        scope="",
        **static,
        **cache.perf(snapshot.perf),
        **_live_columns(snapshot, static["region_names"], static["region_index"]),
        cache=cache,
        perf_identity=snapshot.perf,
    )


def _col(values: list[float]) -> FloatArray:
    return np.asarray(values, dtype=np.float64)


def _static_columns(cands: tuple[Candidate, ...]) -> dict[str, Any]:
    by_model: dict[str, list[int]] = {}
    regions: dict[str, int] = {}
    for c in cands:
        by_model.setdefault(c.deployment.name, []).append(c.index)
        regions.setdefault(c.region.name, len(regions))
    jurisdictions = {c.region.jurisdiction for c in cands}
    certifications = {cert for c in cands for cert in c.region.certifications}
    return {
        "by_model": {m: np.asarray(ix, dtype=np.intp) for m, ix in by_model.items()},
        "region_names": tuple(regions),
        "region_index": np.asarray([regions[c.region.name] for c in cands], dtype=np.intp),
        "jurisdiction": {j: np.asarray([c.region.jurisdiction == j for c in cands]) for j in jurisdictions},
        "certification": {k: np.asarray([k in c.region.certifications for c in cands]) for k in certifications},
        "precision_rank": _col([PRECISION_RANK[c.deployment.precision] for c in cands]),
        "kv_capacity": _col([c.kv_capacity_tokens for c in cands]),
        "hbm_gb": _col([c.gpu.hbm_gb for c in cands]),
        "pue": _col([c.region.pue for c in cands]),
        "price_per_kwh": _col([c.region.price_per_kwh for c in cands]),
        "lat_rad": np.radians(_col([c.region.location.lat for c in cands])),
        "lon_rad": np.radians(_col([c.region.location.lon for c in cands])),
    }


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


def _live_columns(snapshot: FleetSnapshot, region_names: tuple[str, ...], region_index: IndexArray) -> dict[str, Any]:
    """Health, carbon and load: judged once per region, spread to its candidates."""
    verdicts: list[Verdict] = []
    carbon_factor: list[float] = []
    carbon_age: list[float] = []
    fresh_states = []
    configs = {region.name: region for region in snapshot.regions}
    for name in region_names:
        region = configs[name]
        verdicts.append(_health(snapshot, region.name))
        fresh_states.append(snapshot.fresh_live(region.name))
        signal = snapshot.carbon.get(region.grid_zone)
        carbon_factor.append(0.0 if signal is None else signal.value * region.pue / 3.6e6)
        carbon_age.append(np.inf if signal is None else snapshot.now - signal.observed_at)
    n = len(snapshot.candidates)
    load = np.zeros(n)
    if any(state is not None for state in fresh_states):
        for c in snapshot.candidates:
            state = fresh_states[region_index[c.index]]
            if state is not None:
                pool = state.pools.get(c.pool.name, _IDLE)
                replicas = max(1, c.pool.count // c.deployment.tensor_parallel)
                load[c.index] = 0.5 * pool.kv_cache_usage + 0.5 * min(1.0, pool.queue_depth / replicas / 4.0)
    return {
        "region_health": tuple(verdicts),
        "healthy": np.asarray([v is None for v in verdicts], dtype=bool)[region_index],
        "carbon_g_per_j": _col(carbon_factor)[region_index],
        "carbon_age_s": _col(carbon_age)[region_index],
        "load": load,
        "load_fresh": np.asarray([s is not None for s in fresh_states], dtype=bool)[region_index],
    }


def _health(snapshot: FleetSnapshot, region: str) -> Verdict:
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
