"""Each model deployment's replica range, as Ray Serve's autoscaler gets it.

A pool's region file may give each of its models an ``autoscaling:`` block; a model without
one gets the default:

    min_replicas            = 1 (a model scales to zero only where its file says so)
    max_replicas            = the GPUs the pool's blocks leave, split evenly among the models
                              without a block, // tensor_parallel (at least 1)
    target_ongoing_requests = TARGET_SHARE x the engine's max_num_seqs (where the block gives none)
    delays and windows      = Ray Serve's own defaults (30 s up, 600 s down, 10 s metrics, 30 s look-back)

and the pool must hold every model at its maximum at once: sum over models of max_replicas x
tensor_parallel <= count (an error naming the models, their ranges and the count otherwise).
The defaults keep that sum within count, except in a pool too small to hold one replica of
each of its models at once, where each defaulted model still gets one (Ray then places the
replicas that fit); blocks for its models make the split explicit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_MIN_REPLICAS = 1
# Of the engine's max_num_seqs: scale up while a replica's batch still has room (requests beyond
# max_num_seqs queue), and not before it is large enough that J per token has fallen.
TARGET_SHARE = 0.75


# What the ranges are computed from: the region file's blocks (``schema.Autoscaling``,
# ``schema.ModelDeployment``, ``schema.PoolConfig``; frozen, so read-only here) as read here, so
# that the schema, which validates a pool with ``replica_ranges``, need not be imported back.
class AutoscalingBlock(Protocol):
    @property
    def min_replicas(self) -> int: ...
    @property
    def max_replicas(self) -> int: ...
    @property
    def target_ongoing_requests(self) -> float | None: ...
    @property
    def upscale_delay_s(self) -> float: ...
    @property
    def downscale_delay_s(self) -> float: ...
    @property
    def metrics_interval_s(self) -> float: ...
    @property
    def look_back_period_s(self) -> float: ...


class ScaledModel(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def tensor_parallel(self) -> int: ...
    @property
    def autoscaling(self) -> AutoscalingBlock | None: ...


class ScaledPool(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def models(self) -> Sequence[ScaledModel]: ...


@dataclass(frozen=True)
class ReplicaRange:
    """One model deployment's autoscaling settings (runtime form of ``schema.Autoscaling``)."""

    min_replicas: int
    max_replicas: int
    # None: TARGET_SHARE x the engine's max_num_seqs (``ray_config``).
    target_ongoing_requests: float | None = None
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"replica range needs 0 <= min_replicas <= max_replicas >= 1, got "
                             f"{self.min_replicas}..{self.max_replicas}")

    @classmethod
    def of(cls, block: AutoscalingBlock) -> ReplicaRange:
        """The range a region file's ``autoscaling:`` block gives."""
        return cls(block.min_replicas, block.max_replicas, block.target_ongoing_requests, block.upscale_delay_s,
                   block.downscale_delay_s, block.metrics_interval_s, block.look_back_period_s)

    def ray_config(self, max_num_seqs: int) -> dict[str, Any]:
        """Ray Serve's ``autoscaling_config`` for an engine admitting ``max_num_seqs`` sequences."""
        target = self.target_ongoing_requests
        return {
            "min_replicas": self.min_replicas,
            "initial_replicas": self.min_replicas,
            "max_replicas": self.max_replicas,
            "target_ongoing_requests": target if target is not None else max(1.0, TARGET_SHARE * max_num_seqs),
            "upscale_delay_s": self.upscale_delay_s,
            "downscale_delay_s": self.downscale_delay_s,
            "metrics_interval_s": self.metrics_interval_s,
            "look_back_period_s": self.look_back_period_s,
        }


def replica_ranges(pool: ScaledPool) -> dict[str, ReplicaRange]:
    """Model name -> its replica range on ``pool`` (the defaults of the module docstring);
    ValueError when the models' maxima need more GPUs than the pool has."""
    given = {m.name: m.autoscaling for m in pool.models if m.autoscaling is not None}
    used = sum(block.max_replicas * m.tensor_parallel for m in pool.models if (block := given.get(m.name)))
    if used > pool.count:
        terms = ", ".join(f"models[{i}] {m.name}: {given[m.name].max_replicas} x {m.tensor_parallel}"  # type: ignore[union-attr]
                          for i, m in enumerate(pool.models) if m.name in given)
        raise ValueError(f"autoscaling.max_replicas x tensor_parallel sums to {used} GPUs ({terms}) but the pool "
                         f"has count={pool.count}")
    defaulted = [m for m in pool.models if m.name not in given]
    share = (pool.count - used) // len(defaulted) if defaulted else 0
    ranges: dict[str, ReplicaRange] = {}
    for i, m in enumerate(pool.models):
        block = given.get(m.name)
        if block is not None:
            ranges[m.name] = ReplicaRange.of(block)
            continue
        # At least one replica where one fits the GPUs left: a pool too small to hold one of
        # each model at once (2 GPUs, a TP-2 and a TP-1 model) keeps serving both, and Ray
        # places the replicas that fit.
        most = max(1, share // m.tensor_parallel)
        if m.tensor_parallel > pool.count - used:
            raise ValueError(f"models[{i}] {m.name}: no autoscaling block, and the {pool.count - used} GPUs the other "
                             f"models' blocks leave hold no replica of tensor_parallel={m.tensor_parallel} (give it "
                             "an autoscaling block, or lower the others' max_replicas)")
        ranges[m.name] = ReplicaRange(DEFAULT_MIN_REPLICAS, most)
    return ranges


class ScaledRegion(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def pools(self) -> Sequence[ScaledPool]: ...


def models_that_may_all_be_cold(regions: Sequence[ScaledRegion]) -> dict[str, list[str]]:
    """Model name -> the pools (``region/pool``) serving it, for each model whose every pool may
    scale it to zero (``min_replicas`` 0): while all of them are at zero, the router's cold-pool
    filter keeps none for a request whose TTFT budget is shorter than a cold start, so only
    requests that can wait (deferrable ones) wake one; interactive requests are refused until
    then. A trade-off an operator makes knowingly, so it is a warning, not an error."""
    pools_of: dict[str, list[str]] = {}
    warm_somewhere: set[str] = set()
    for region in regions:
        for pool in region.pools:
            for model, replicas in replica_ranges(pool).items():
                pools_of.setdefault(model, []).append(f"{region.name}/{pool.name}")
                if replicas.min_replicas > 0:
                    warm_somewhere.add(model)
    return {model: pools for model, pools in pools_of.items() if model not in warm_somewhere}

