"""Building the immutable ``FleetSnapshot`` a decision reads.

``SnapshotBuilder`` is made once per config (it enumerates the candidates and their static
facts); ``build(now, carbon, live, ...)`` is called by the background refresher about once
a second (router), at every event (simulator) or once (``route --explain``). It turns live
state into per-candidate coefficients so that a decision does only arithmetic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model import EnergyModel
from scheduler.energy.models import MODEL_CATALOGUE, PRECISION_BYTES
from scheduler.energy.profile_model import ProfileEnergyModel
from scheduler.framework.arrays import ColumnCache
from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, PoolLiveState, RegionLiveState, Signal

# Share of HBM vLLM may use (its gpu_memory_utilization default).
GPU_MEMORY_UTILIZATION = 0.9


@dataclass(frozen=True)
class PerfAssumptions:
    """How fast the hardware runs, for latency prediction (not energy)."""

    prefill_mfu: float = 0.5
    decode_bw_efficiency: float = 0.7
    # Concurrent sequences per replica assumed when a pool's live state is unknown.
    nominal_batch: float = 16.0
    # Average time a queued request waits per request ahead of it, per replica.
    queue_s_per_waiting: float = 0.25


def kv_capacity_tokens(candidate_region: RegionConfig, pool_index: int, deployment_index: int) -> int:
    pool = candidate_region.pools[pool_index]
    deployment = pool.models[deployment_index]
    gpu = GPU_CATALOGUE[pool.gpu]
    model = MODEL_CATALOGUE[deployment.name]
    usable = gpu.hbm_bytes * GPU_MEMORY_UTILIZATION * deployment.tensor_parallel
    free_for_kv = usable - model.weight_bytes(deployment.precision)
    if free_for_kv <= 0:
        return 0
    return min(deployment.max_context, int(free_for_kv / model.kv_bytes_per_token_at(deployment.precision)))


def enumerate_candidates(regions: Sequence[RegionConfig]) -> tuple[Candidate, ...]:
    candidates: list[Candidate] = []
    for region in regions:
        for p, pool in enumerate(region.pools):
            for d, deployment in enumerate(pool.models):
                candidates.append(
                    Candidate(
                        index=len(candidates),
                        region=region,
                        pool=pool,
                        deployment=deployment,
                        gpu=GPU_CATALOGUE[pool.gpu],
                        model=MODEL_CATALOGUE[deployment.name],
                        kv_capacity_tokens=kv_capacity_tokens(region, p, d),
                    )
                )
    return tuple(candidates)


# Memoized per-candidate performance entries kept before the memo starts over.
PERF_MEMO_LIMIT = 200_000


@dataclass
class SnapshotBuilder:
    """Builds snapshots of one fleet under one policy.

    A candidate's ``CandidatePerf`` depends only on the candidate and its pool's live state
    when that state is fresh, so entries are memoized on (candidate, fresh pool state), and
    when no fresh pool state changed since the last build the last ``perf`` tuple itself is
    reused (then the snapshot's perf columns are too: ``ColumnCache``).
    """

    regions: tuple[RegionConfig, ...]
    policy: PolicyConfig
    energy_model: EnergyModel = field(default_factory=ProfileEnergyModel)
    perf: PerfAssumptions = field(default_factory=PerfAssumptions)

    def __post_init__(self) -> None:
        self.candidates = enumerate_candidates(self.regions)
        self.columns = ColumnCache()
        self._perf_memo: dict[tuple[int, PoolLiveState | None], CandidatePerf] = {}
        self._last: tuple[tuple[object, ...], tuple[CandidatePerf, ...]] | None = None

    def build(
        self,
        now: float,
        carbon: Mapping[str, Signal] | None = None,
        live: Mapping[str, RegionLiveState] | None = None,
        energy_routing_enabled: bool = True,
    ) -> FleetSnapshot:
        live = live or {}
        fresh = {region.name: self._fresh_pools(live.get(region.name), now) for region in self.regions}
        key = tuple(fresh.values())
        if self._last is not None and self._last[0] == key:
            perf = self._last[1]
        else:
            perf = tuple(self._memo_perf(c, fresh[c.region.name]) for c in self.candidates)
            self._last = (key, perf)
        return FleetSnapshot(
            now=now,
            policy=self.policy,
            regions=self.regions,
            candidates=self.candidates,
            perf=perf,
            carbon=dict(carbon or {}),
            live=dict(live),
            energy_routing_enabled=energy_routing_enabled,
            column_cache=self.columns,
        )

    def _fresh_pools(self, state: RegionLiveState | None, now: float) -> Mapping[str, PoolLiveState] | None:
        if state is None or now - state.observed_at > self.policy.max_age.region_state:
            return None
        return state.pools

    def _memo_perf(self, c: Candidate, pools: Mapping[str, PoolLiveState] | None) -> CandidatePerf:
        pool_state = None if pools is None else pools.get(c.pool.name)
        key = (c.index, pool_state)
        perf = self._perf_memo.get(key)
        if perf is None:
            if len(self._perf_memo) >= PERF_MEMO_LIMIT:
                self._perf_memo.clear()
            perf = self.perf_of(c, pool_state)
            self._perf_memo[key] = perf
        return perf

    def perf_of(self, c: Candidate, pool_state: PoolLiveState | None) -> CandidatePerf:
        """The candidate's performance with its pool in ``pool_state`` (None: unknown or
        stale; the nominal batch and no queue are assumed)."""
        assumptions = self.perf
        replicas = max(1, c.pool.count // c.deployment.tensor_parallel)
        if pool_state is not None:
            batch = max(1.0, pool_state.running / replicas)
            waiting = pool_state.queue_depth / replicas
        else:
            batch, waiting = assumptions.nominal_batch, 0.0
        tp = c.deployment.tensor_parallel
        fast_math = 2.0 if PRECISION_BYTES[c.deployment.precision] < 2 else 1.0
        flops_per_s = c.gpu.peak_bf16_tflops * 1e12 * assumptions.prefill_mfu * tp * fast_math
        bandwidth = c.gpu.mem_bandwidth_gbs * 1e9 * assumptions.decode_bw_efficiency * tp
        model = c.model
        return CandidatePerf(
            energy=self.energy_model.coefficients(model, c.gpu, c.deployment.precision, tp, batch),
            batch=batch,
            queue_wait_s=waiting * assumptions.queue_s_per_waiting,
            prefill_s_per_token=2.0 * model.active_b * 1e9 / flops_per_s,
            # attention: 2 (QK and AV) x 2 FLOP x layers x hidden per (query, key) pair
            prefill_s_per_attention_pair=4.0 * model.layers * model.hidden / flops_per_s,
            decode_step_s=model.active_b * 1e9 * PRECISION_BYTES[c.deployment.precision] / bandwidth,
            decode_step_s_per_context=batch * model.kv_bytes_per_token_at(c.deployment.precision) / bandwidth,
            live=pool_state is not None,
        )
