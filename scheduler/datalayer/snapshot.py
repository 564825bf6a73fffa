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
from scheduler.types import Candidate, CandidatePerf, FleetSnapshot, RegionLiveState, Signal

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


@dataclass
class SnapshotBuilder:
    regions: tuple[RegionConfig, ...]
    policy: PolicyConfig
    energy_model: EnergyModel = field(default_factory=ProfileEnergyModel)
    perf: PerfAssumptions = field(default_factory=PerfAssumptions)

    def __post_init__(self) -> None:
        self.candidates = enumerate_candidates(self.regions)

    def build(
        self,
        now: float,
        carbon: Mapping[str, Signal] | None = None,
        live: Mapping[str, RegionLiveState] | None = None,
        energy_routing_enabled: bool = True,
    ) -> FleetSnapshot:
        live = live or {}
        max_age = self.policy.max_age.region_state
        perf = tuple(self._perf(c, live.get(c.region.name), now, max_age) for c in self.candidates)
        return FleetSnapshot(
            now=now,
            policy=self.policy,
            regions=self.regions,
            candidates=self.candidates,
            perf=perf,
            carbon=dict(carbon or {}),
            live=dict(live),
            energy_routing_enabled=energy_routing_enabled,
        )

    def _perf(self, c: Candidate, state: RegionLiveState | None, now: float, max_age: float) -> CandidatePerf:
        assumptions = self.perf
        replicas = max(1, c.pool.count // c.deployment.tensor_parallel)
        pool_state = state.pools.get(c.pool.name) if state is not None else None
        fresh = pool_state is not None and state is not None and now - state.observed_at <= max_age
        if fresh and pool_state is not None:
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
            live=fresh,
        )

