"""The snapshot as columns: one numpy array per per-candidate fact, built once per snapshot.

A decision touches every candidate that serves the model several times (filters, the
estimates, five scorers). Done per candidate in Python that costs ~3 us per candidate; as
columns it costs ~1 us per operation whatever the fleet size, which is what keeps a
12-region x 4-pool decision in tens of microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt

from scheduler.energy.models import PRECISION_RANK
from scheduler.types import Candidate, FleetSnapshot, GeoPoint, PoolLiveState

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
    # live-dependent
    queue_wait_s: FloatArray
    prefill_s_per_token: FloatArray
    prefill_s_per_pair: FloatArray
    decode_step_s: FloatArray
    decode_step_s_per_context: FloatArray
    e_prefill_per_token: FloatArray
    e_start: FloatArray
    e_step: FloatArray
    e_step_per_context: FloatArray
    e_idle_w: FloatArray
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
    _rtt_memo: dict[tuple[float, float], FloatArray] = field(default_factory=dict, repr=False)
    _pools_lacking: dict[str, tuple[Candidate, ...]] = field(default_factory=dict, repr=False)
    _restricted: dict[str, FleetArrays] = field(default_factory=dict, repr=False)

    def restricted(self, key: str, index: IndexArray) -> FleetArrays:
        """These columns restricted to the candidates at ``index`` (memoized under ``key``,
        the model name: every request for a model starts from the same candidates)."""
        cols = self._restricted.get(key)
        if cols is None:
            values: dict[str, object] = {}
            for f in fields(self):
                if not f.init or f.name.startswith("_"):
                    continue
                value = getattr(self, f.name)
                if f.name == "by_model":
                    values[f.name] = {}
                elif f.name == "health":
                    values[f.name] = tuple(value[i] for i in index.tolist())
                elif isinstance(value, np.ndarray):
                    values[f.name] = value[index]
                else:  # the jurisdiction / certification masks
                    values[f.name] = {k: mask[index] for k, mask in value.items()}
            cols = FleetArrays(**values)  # type: ignore[arg-type]
            self._restricted[key] = cols
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


def build_arrays(snapshot: FleetSnapshot) -> FleetArrays:
    cands = snapshot.candidates
    perf = snapshot.perf

    def col(values: list[float]) -> FloatArray:
        return np.asarray(values, dtype=np.float64)

    by_model: dict[str, list[int]] = {}
    for c in cands:
        by_model.setdefault(c.deployment.name, []).append(c.index)
    jurisdictions = {c.region.jurisdiction for c in cands}
    certifications = {cert for c in cands for cert in c.region.certifications}

    health = tuple(_health(snapshot, c.region.name) for c in cands)
    carbon_factor, carbon_age = [], []
    load, load_fresh = [], []
    for c in cands:
        signal = snapshot.carbon.get(c.region.grid_zone)
        carbon_factor.append(0.0 if signal is None else signal.value * c.region.pue / 3.6e6)
        carbon_age.append(np.inf if signal is None else snapshot.now - signal.observed_at)
        state = snapshot.fresh_live(c.region.name)
        load_fresh.append(state is not None)
        pool = state.pools.get(c.pool.name, _IDLE) if state is not None else _IDLE
        replicas = max(1, c.pool.count // c.deployment.tensor_parallel)
        load.append(0.5 * pool.kv_cache_usage + 0.5 * min(1.0, pool.queue_depth / replicas / 4.0))

    return FleetArrays(
        by_model={m: np.asarray(ix, dtype=np.intp) for m, ix in by_model.items()},
        jurisdiction={j: np.asarray([c.region.jurisdiction == j for c in cands]) for j in jurisdictions},
        certification={k: np.asarray([k in c.region.certifications for c in cands]) for k in certifications},
        precision_rank=col([PRECISION_RANK[c.deployment.precision] for c in cands]),
        kv_capacity=col([c.kv_capacity_tokens for c in cands]),
        max_context=col([c.deployment.max_context for c in cands]),
        hbm_gb=col([c.gpu.hbm_gb for c in cands]),
        pue=col([c.region.pue for c in cands]),
        price_per_kwh=col([c.region.price_per_kwh for c in cands]),
        lat_rad=np.radians(col([c.region.location.lat for c in cands])),
        lon_rad=np.radians(col([c.region.location.lon for c in cands])),
        queue_wait_s=col([p.queue_wait_s for p in perf]),
        prefill_s_per_token=col([p.prefill_s_per_token for p in perf]),
        prefill_s_per_pair=col([p.prefill_s_per_attention_pair for p in perf]),
        decode_step_s=col([p.decode_step_s for p in perf]),
        decode_step_s_per_context=col([p.decode_step_s_per_context for p in perf]),
        e_prefill_per_token=col([p.energy.prefill_j_per_token for p in perf]),
        e_start=col([p.energy.start_j for p in perf]),
        e_step=col([p.energy.step_j for p in perf]),
        e_step_per_context=col([p.energy.step_j_per_context_token for p in perf]),
        e_idle_w=col([p.energy.idle_w for p in perf]),
        health=health,
        healthy=np.asarray([h is None for h in health]),
        carbon_g_per_j=col(carbon_factor),
        carbon_age_s=col(carbon_age),
        load=col(load),
        load_fresh=np.asarray(load_fresh, dtype=bool),
    )


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
