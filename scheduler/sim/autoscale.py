"""The simulator's replica autoscaler: Ray Serve's default autoscaling policy, per pool.

Each pool deployment of a region app scales with Ray Serve's own autoscaler
(``autoscaling_config``); the simulator runs the same policy on the same settings, so that a
policy which concentrates load is charged for the replicas it keeps warm and wakes. The
formula mirrors Ray Serve 2.60's ``ray/serve/autoscaling_policy.py``
(``replica_queue_length_autoscaling_policy`` wrapped by ``_apply_autoscaling_config``) and the
bounds of ``ray/serve/_private/autoscaling_state.py`` (``apply_bounds``):

    cold-start fast path   current = 0 and ongoing > 0:  decision = max(ceil(1 x upscaling_factor), target)
    core policy            desired = current x ongoing / (target_ongoing_requests x current)
                                   (= target when current = 0)
    scaling factors        desired' = ceil(current + factor x (desired - current))   (current > 0;
                           upscaling_factor when desired > current, downscaling_factor otherwise;
                           a downscale stuck at current by the factor is current - 1)
    from zero              current = 0 and desired' > 0: decision = desired' (no delay)
    delay                  an upscale (desired' > target) is taken once ``upscale_delay_s`` has
                           passed since the first of an unbroken run of upscale wishes; a
                           downscale once ``downscale_delay_s`` has passed (1 -> 0:
                           ``downscale_to_zero_delay_s`` when set), never below 1 except from 1;
                           a wish the other way, or none, restarts the clock
    bounds                 decision clipped to [min_replicas, max_replicas]

``current`` is the replicas running (warm), ``target`` the autoscaler's last decision (warm +
starting), ``ongoing`` the requests on the pool's replicas (waiting + running) plus those
held for a replica to start, averaged over the samples of the last ``look_back_period_s``
(Ray's aggregation function ``mean``). The simulator takes a sample and a decision every
``metrics_interval_s`` of the pool (at the first tick of the engine's once that has passed; the
engine ticks at the shortest interval of the fleet's pools) (Ray's replicas push their metrics every 10 s and its controller
decides every 0.1 s on the latest: between two pushes its inputs do not change, so the delays
are kept to within one interval here).

A replica the autoscaler adds is cold for the pool's ``cold_start_s`` (weights loaded, engine
started): it takes no request and draws ``cold_start_j`` over that time. A replica it removes
takes no new request, finishes those it holds, and stops (Ray Serve's graceful shutdown);
starting replicas are removed first, then the warm ones with the fewest requests.

Where each pool's settings come from (``AutoscalingSettings.for_pool``), the same sources as
in production:

    autoscaler   the model's ``autoscaling:`` block in the pool's region file, else the default
                 of ``scheduler.config.autoscaling.replica_ranges``; turned into Ray Serve's
                 ``autoscaling_config`` by ``ReplicaRange.ray_config`` at the engine's
                 max_num_seqs, the function the Ray Serve app (scheduler.region.app) builds its
                 deployments' config with
    cold start   ``scheduler.energy.cold_start.cold_start`` for the pool's GPU, model, precision
                 and tensor_parallel, with the pool's ``cold_start_s`` / ``cold_start_j`` where
                 the region file gives them: the function the router prices cold pools with

A field of ``AutoscalingSettings`` that is set overrides it on every pool (``simulate
--min-replicas``, tests); None keeps the pool's own. Ray Serve's fields that neither the
schema nor the default sets (factors 1, no separate downscale-to-zero delay) keep Ray's
defaults.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from dataclasses import dataclass

from scheduler.config.autoscaling import replica_ranges
from scheduler.energy.cold_start import cold_start
from scheduler.types import Candidate


@dataclass(frozen=True)
class PoolAutoscaling:
    """One pool's autoscaling config (Ray Serve's ``autoscaling_config`` fields) and the cost of
    one replica's cold start [s, J]. ``initial_replicas`` None: ``min_replicas`` (Ray's)."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float
    cold_start_s: float
    cold_start_j: float
    initial_replicas: int | None = None
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or self.max_replicas < max(1, self.min_replicas):
            raise ValueError(f"autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{self.min_replicas} and {self.max_replicas}")
        for name in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s", "upscaling_factor",
                     "downscaling_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"autoscaling {name} must be positive, got {getattr(self, name)}")
        for name in ("upscale_delay_s", "downscale_delay_s", "cold_start_s", "cold_start_j"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"autoscaling {name} must be >= 0, got {getattr(self, name)}")

    def bounds(self, replicas: int) -> tuple[int, int]:
        """(min, max) replicas of a pool whose GPUs hold ``replicas``."""
        top = min(self.max_replicas, replicas)
        return min(self.min_replicas, top), top

    def initial(self, replicas: int) -> int:
        """Replicas warm at the start of a run (Ray: ``initial_replicas``, else min_replicas)."""
        low, high = self.bounds(replicas)
        return max(low, min(high, self.min_replicas if self.initial_replicas is None else self.initial_replicas))


@dataclass(frozen=True)
class AutoscalingSettings:
    """What every pool's autoscaling takes from the run rather than from its region file (the
    module docstring): each field that is not None replaces the pool's own."""

    min_replicas: int | None = None
    max_replicas: int | None = None
    initial_replicas: int | None = None
    target_ongoing_requests: float | None = None
    metrics_interval_s: float | None = None
    look_back_period_s: float | None = None
    upscale_delay_s: float | None = None
    downscale_delay_s: float | None = None
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    cold_start_s: float | None = None
    cold_start_j: float | None = None

    def for_pool(self, candidate: Candidate, max_num_seqs: int) -> PoolAutoscaling:
        """``candidate``'s pool's settings for its model (the module docstring's sources), for
        an engine admitting ``max_num_seqs`` sequences, with this object's overrides."""
        pool, deployment = candidate.pool, candidate.deployment
        ray = replica_ranges(pool)[deployment.name].ray_config(max_num_seqs)
        start = cold_start(candidate.gpu, candidate.model, deployment.precision, deployment.tensor_parallel,
                           pool.cold_start_s if self.cold_start_s is None else self.cold_start_s,
                           pool.cold_start_j if self.cold_start_j is None else self.cold_start_j)
        own = PoolAutoscaling(
            min_replicas=ray["min_replicas"], max_replicas=ray["max_replicas"],
            target_ongoing_requests=ray["target_ongoing_requests"], cold_start_s=start.seconds,
            cold_start_j=start.joules, initial_replicas=ray["initial_replicas"],
            metrics_interval_s=ray["metrics_interval_s"], look_back_period_s=ray["look_back_period_s"],
            upscale_delay_s=ray["upscale_delay_s"], downscale_delay_s=ray["downscale_delay_s"])
        overrides = {f.name: value for f in dataclasses.fields(self)
                     if f.name not in ("cold_start_s", "cold_start_j") and (value := getattr(self, f.name)) is not None}
        if self.min_replicas is not None and self.initial_replicas is None:
            overrides["initial_replicas"] = self.min_replicas  # Ray's initial replicas: the minimum
        return dataclasses.replace(own, **overrides)


class PoolAutoscaler:
    """The autoscaler state of one pool (the module doc's formula; Ray Serve's policy state:
    the direction and start time of the unbroken run of wishes)."""

    __slots__ = ("_samples", "_wish_direction", "_wish_since", "high", "low", "settings", "target")

    # Slack on the metrics interval: ticks at float multiples of it fall a hair early or late.
    _TICK_SLACK_S = 1e-6

    def __init__(self, settings: PoolAutoscaling, replicas: int) -> None:
        self.settings = settings
        self.low, self.high = settings.bounds(replicas)
        self.target = settings.initial(replicas)
        self._samples: deque[tuple[float, float]] = deque()
        self._wish_direction = 0
        self._wish_since: float | None = None

    def due(self, now: float) -> bool:
        """Whether the pool's ``metrics_interval_s`` has passed since its last sample."""
        samples = self._samples
        return not samples or now - samples[-1][0] + self._TICK_SLACK_S >= self.settings.metrics_interval_s

    def observe(self, now: float, ongoing: float) -> float:
        """Record a sample of the pool's ongoing requests; returns the mean over the look-back."""
        samples = self._samples
        samples.append((now, ongoing))
        horizon = now - self.settings.look_back_period_s
        while samples[0][0] <= horizon:
            samples.popleft()
        return sum(value for _, value in samples) / len(samples)

    def decide(self, now: float, current: int, ongoing: float) -> int:
        """The new target replica count at ``now`` with ``current`` replicas running and a mean
        of ``ongoing`` requests (the module doc's formula)."""
        s = self.settings
        if current == 0 and ongoing > 0:  # cold-start fast path (the wish state as it was)
            self.target = self._bounded(max(math.ceil(1 * s.upscaling_factor), self.target))
            return self.target
        desired: float = self.target if current == 0 else current * (ongoing / (s.target_ongoing_requests * current))
        if current == 0:
            scaled = math.ceil(desired)
        else:
            delta = desired - current
            factor = s.upscaling_factor if delta > 0 else s.downscaling_factor
            scaled = math.ceil(current + factor * delta)
            if math.ceil(desired) < current and scaled == current:
                scaled -= 1
        if current == 0 and scaled > 0:
            self.target = self._bounded(scaled)
            return self.target
        self.target = self._bounded(self._delayed(max(0, scaled), now))
        return self.target

    def _delayed(self, desired: int, now: float) -> int:
        """Ray Serve's ``_apply_delay_logic``: the wish is taken once it has lasted its delay."""
        s = self.settings
        target = self.target
        if desired > target:
            direction, delay = 1, s.upscale_delay_s
        elif desired < target:
            direction = -1
            if target == 1:
                delay = s.downscale_delay_s if s.downscale_to_zero_delay_s is None else s.downscale_to_zero_delay_s
            else:
                delay = s.downscale_delay_s
                desired = max(1, desired)
        else:
            self._wish_direction, self._wish_since = 0, None
            return target
        if self._wish_direction != direction:
            self._wish_direction, self._wish_since = direction, None
        if self._wish_since is None:
            self._wish_since = now
        if now - self._wish_since + 1e-6 >= delay:  # Ray's _DELAY_ELAPSED_EPS_S
            self._wish_direction, self._wish_since = 0, None
            return desired
        return target

    def _bounded(self, replicas: int) -> int:
        return max(self.low, min(self.high, replicas))
