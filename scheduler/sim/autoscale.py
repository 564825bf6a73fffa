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
``metrics_interval_s`` (Ray's replicas push their metrics every 10 s and its controller
decides every 0.1 s on the latest: between two pushes its inputs do not change, so the delays
are kept to within one interval here).

A replica the autoscaler adds is cold for ``cold_start_s`` (weights loaded, engine started):
it takes no request and draws ``cold_start_j`` over that time. A replica it removes takes no
new request, finishes those it holds, and stops (Ray Serve's graceful shutdown); starting
replicas are removed first, then the warm ones with the fewest requests.

``AutoscalingSettings`` uses the names of the region schema's per-pool ``autoscaling:`` block
(min_replicas, max_replicas, target_ongoing_requests, upscale_delay_s, downscale_delay_s) and
pool fields (``cold_start_s``, ``cold_start_j``), so that a region file's values can be
passed in as they are.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class AutoscalingSettings:
    """One pool's autoscaling config and cold-start cost. Defaults: Ray Serve's
    ``AutoscalingConfig`` where it has one for the field (metrics interval 10 s, look-back 30 s,
    upscale delay 30 s, downscale delay 600 s, factors 1, min_replicas 1, initial replicas =
    min_replicas); ``max_replicas`` None: every replica the pool's GPUs hold (count /
    tensor_parallel); ``target_ongoing_requests`` 32 (Ray Serve's default of 2 would keep a
    vLLM replica at batch 2; Ray Serve LLM's, 1e9, never scales up on load): a replica with
    32 requests in flight runs decode batches of 32, well inside vLLM's 256 sequences;
    ``cold_start_s`` 60 s (an 8B model's weights from local disk, engine start and CUDA graph
    capture; not measured here); ``cold_start_j`` None: the replica's idle power over
    ``cold_start_s``, a floor (loading and graph capture run above idle)."""

    min_replicas: int = 1
    max_replicas: int | None = None
    initial_replicas: int | None = None
    target_ongoing_requests: float = 32.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0
    downscale_to_zero_delay_s: float | None = None
    upscaling_factor: float = 1.0
    downscaling_factor: float = 1.0
    cold_start_s: float = 60.0
    cold_start_j: float | None = None

    def __post_init__(self) -> None:
        if self.min_replicas < 0 or (self.max_replicas is not None and self.max_replicas < max(1, self.min_replicas)):
            raise ValueError(f"autoscaling needs 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{self.min_replicas} and {self.max_replicas}")
        for name in ("target_ongoing_requests", "metrics_interval_s", "look_back_period_s", "upscaling_factor",
                     "downscaling_factor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"autoscaling {name} must be positive, got {getattr(self, name)}")
        for name in ("upscale_delay_s", "downscale_delay_s", "cold_start_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"autoscaling {name} must be >= 0, got {getattr(self, name)}")

    def bounds(self, replicas: int) -> tuple[int, int]:
        """(min, max) replicas of a pool whose GPUs hold ``replicas``."""
        top = replicas if self.max_replicas is None else min(self.max_replicas, replicas)
        return min(self.min_replicas, top), top

    def initial(self, replicas: int) -> int:
        """Replicas warm at the start of a run (Ray: ``initial_replicas``, else min_replicas)."""
        low, high = self.bounds(replicas)
        return max(low, min(high, self.min_replicas if self.initial_replicas is None else self.initial_replicas))

    def start_energy_j(self, idle_w: float) -> float:
        """Energy of one replica's cold start [J]."""
        return self.cold_start_s * idle_w if self.cold_start_j is None else self.cold_start_j


class PoolAutoscaler:
    """The autoscaler state of one pool (the module doc's formula; Ray Serve's policy state:
    the direction and start time of the unbroken run of wishes)."""

    __slots__ = ("_samples", "_wish_direction", "_wish_since", "high", "low", "settings", "target")

    def __init__(self, settings: AutoscalingSettings, replicas: int) -> None:
        self.settings = settings
        self.low, self.high = settings.bounds(replicas)
        self.target = settings.initial(replicas)
        self._samples: deque[tuple[float, float]] = deque()
        self._wish_direction = 0
        self._wish_since: float | None = None

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
