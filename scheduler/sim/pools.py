"""Simulated pools: a FIFO queue in front of continuous batching, and a prefix cache.

A pool of R replicas (``count // tensor_parallel``) runs at most R x ``max_seqs`` sequences
whose KV cache fits in R x the replica's free HBM; the rest wait in FIFO order. A request that
starts at time t on a pool then running b sequences per replica (b counted with it) takes

    prefill = uncached x prefill_s_per_token + uncached x (C - uncached/2) x prefill_s_per_attention_pair
    decode  = N x (decode_step_s + decode_step_s_per_context(b) x (C + N/2))
    TTFT    = RTT + queue wait + prefill;   done at t + prefill + decode
    energy  = E_fixed + N x E_step at batch b + idle floor x queue wait    (scheduler.energy.model)

with the coefficients of ``SnapshotBuilder`` at batch b (``BatchPerfTable``), so the physics
the simulator runs is the model the scheduler predicts with, evaluated at the true batch,
the true queue wait and the true prefix-cache hit. The batch is fixed when the request starts
(a fluid approximation: per-step batch changes and prefill/decode interference are ignored).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from scheduler.datalayer.snapshot import GPU_MEMORY_UTILIZATION, SnapshotBuilder
from scheduler.types import Candidate, CandidatePerf, Decision, GeoPoint, PoolLiveState, Request

# vLLM's default max_num_seqs: sequences one replica batches at most.
VLLM_MAX_NUM_SEQS = 256
# Prefix-cache entries (distinct shared prefixes) each replica keeps before evicting the LRU one.
PREFIX_ENTRIES_PER_REPLICA = 8


def replicas_of(candidate: Candidate) -> int:
    return max(1, candidate.pool.count // candidate.deployment.tensor_parallel)


def kv_tokens_per_replica(candidate: Candidate) -> int:
    """KV-cache tokens one replica holds across all its sequences."""
    d = candidate.deployment
    usable = candidate.gpu.hbm_bytes * GPU_MEMORY_UTILIZATION * d.tensor_parallel
    free = usable - candidate.model.weight_bytes(d.precision)
    return max(0, int(free / candidate.model.kv_bytes_per_token_at(d.precision)))


class BatchPerfTable:
    """Every candidate's ``CandidatePerf`` at an integer per-replica batch, from the same
    ``SnapshotBuilder`` the scheduler's snapshots come from (built once per batch size)."""

    def __init__(self, builder: SnapshotBuilder) -> None:
        self._builder = builder
        self._by_batch: dict[int, tuple[CandidatePerf, ...]] = {}
        self._geometry = self._builder.build(0.0, {}, {}).arrays

    def rtt_s(self, client: GeoPoint | None, candidate: Candidate) -> float:
        """Round trip from the client to the candidate's region, as the scheduler predicts it."""
        row = self._geometry.rtt_s(client)
        return 0.0 if row is None else float(row[candidate.index])

    def at(self, batch: int) -> tuple[CandidatePerf, ...]:
        perf = self._by_batch.get(batch)
        if perf is None:
            perf = tuple(
                self._builder.perf_of(c, PoolLiveState(running=batch * replicas_of(c))) for c in self._builder.candidates
            )
            self._by_batch[batch] = perf
        return perf


@dataclass(slots=True)
class Job:
    """A request on its way through the fleet."""

    row: int
    request: Request
    arrived: float
    # Length of the request's shared prefix (served from cache on a hit).
    prefix_tokens: int
    # The scheduler's decision: dispatch walks its ranking (failover moves down the list).
    decision: Decision
    # Position in the ranking of the pool it was sent to.
    rank: int = 0
    enqueued: float = 0.0


@dataclass(frozen=True, slots=True)
class Started:
    """What the simulator measured when a request started on a pool."""

    ttft_s: float
    done_at: float
    energy_j: float
    cached_tokens: int
    queue_wait_s: float
    kv_tokens: int


class PoolSim:
    __slots__ = (
        "_cache", "_cache_entries", "_hits", "_live", "_lookups", "candidate", "down", "kv_capacity",
        "kv_used", "queue", "replicas", "running", "seq_capacity",
    )

    def __init__(self, candidate: Candidate, max_seqs: int = VLLM_MAX_NUM_SEQS) -> None:
        self.candidate = candidate
        self.replicas = replicas_of(candidate)
        self.seq_capacity = self.replicas * max_seqs
        self.kv_capacity = self.replicas * kv_tokens_per_replica(candidate)
        self.running = 0
        self.kv_used = 0
        self.queue: deque[Job] = deque()
        self.down = False
        self._cache: OrderedDict[str, None] = OrderedDict()
        self._cache_entries = self.replicas * PREFIX_ENTRIES_PER_REPLICA
        self._hits = 0
        self._lookups = 0
        self._live: PoolLiveState | None = None

    def has_room(self, kv_tokens: int) -> bool:
        return self.running < self.seq_capacity and self.kv_used + kv_tokens <= self.kv_capacity

    def enqueue(self, job: Job, now: float) -> None:
        job.enqueued = now
        self.queue.append(job)
        self._live = None

    def next_startable(self) -> Job | None:
        """The head of the queue if it fits now (FIFO: nothing overtakes it)."""
        if not self.queue:
            return None
        head = self.queue[0].request
        if not self.has_room(head.prompt_tokens + head.max_tokens):
            return None
        self._live = None
        return self.queue.popleft()

    def drain(self) -> list[Job]:
        """Take every queued job (the region went down before they started)."""
        jobs = list(self.queue)
        self.queue.clear()
        self._live = None
        return jobs

    def start(self, job: Job, now: float, table: BatchPerfTable) -> Started:
        request = job.request
        kv_tokens = request.prompt_tokens + request.max_tokens
        self.running += 1
        self.kv_used += kv_tokens
        self._live = None
        cached = self._prefix_hit(request.prefix_key, job.prefix_tokens)
        batch = -(-self.running // self.replicas)
        perf = table.at(batch)[self.candidate.index]
        prompt, out = request.prompt_tokens, request.max_tokens
        uncached = prompt - cached
        prefill = uncached * perf.prefill_s_per_token + uncached * (prompt - uncached * 0.5) * perf.prefill_s_per_attention_pair
        step = perf.decode_step_s + perf.decode_step_s_per_context * (prompt + out * 0.5)
        wait = now - job.enqueued
        return Started(
            ttft_s=table.rtt_s(request.client_location, self.candidate) + (now - job.arrived) + prefill,
            done_at=now + prefill + out * step,
            energy_j=perf.energy.joules(prompt, cached, out, wait),
            cached_tokens=cached,
            queue_wait_s=wait,
            kv_tokens=kv_tokens,
        )

    def finish(self, kv_tokens: int) -> None:
        self.running -= 1
        self.kv_used -= kv_tokens
        self._live = None

    def _prefix_hit(self, key: str | None, tokens: int) -> int:
        """Tokens served from the prefix cache (the caller's shared prefix if resident)."""
        if key is None:
            return 0
        self._lookups += 1
        cache = self._cache
        if key in cache:
            cache.move_to_end(key)
            self._hits += 1
            return tokens
        cache[key] = None
        if len(cache) > self._cache_entries:
            cache.popitem(last=False)
        return 0

    def live(self) -> PoolLiveState:
        """What the pool would publish now (the same object while nothing changed)."""
        live = self._live
        if live is None:
            hit_rate = round(self._hits / self._lookups, 2) if self._lookups else 0.0
            live = PoolLiveState(
                queue_depth=len(self.queue),
                running=self.running,
                kv_cache_usage=round(self.kv_used / self.kv_capacity, 3) if self.kv_capacity else 1.0,
                prefix_cache_hit_rate=hit_rate,
            )
            self._live = live
        return live
