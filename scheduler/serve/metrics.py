"""The region's custom metrics (``ray.util.metrics``; Ray exports them with a ``ray_`` prefix
on its metrics port, which the Ray dashboard's Prometheus service discovery lists)."""

from __future__ import annotations

from typing import Any

from scheduler.serve.sse import Usage

TTFT_BOUNDARIES_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class GatewayMetrics:
    def __init__(self, region: str, pool: str) -> None:
        from ray.util import metrics

        self._tags = {"region": region, "pool": pool}
        keys = ("region", "pool")
        self.requests = metrics.Counter(
            "scheduler_region_requests", description="Requests a region answered.", tag_keys=keys
        )
        self.errors = metrics.Counter(
            "scheduler_region_errors", description="Requests a region failed.", tag_keys=keys
        )
        self.energy_j = metrics.Counter(
            "scheduler_region_energy_joules", description="Energy billed to requests (J).", tag_keys=keys
        )
        self.prompt_tokens = metrics.Counter(
            "scheduler_region_prompt_tokens", description="Prompt tokens served.", tag_keys=keys
        )
        self.cached_tokens = metrics.Counter(
            "scheduler_region_cached_tokens", description="Prompt tokens served from the prefix cache.",
            tag_keys=keys,
        )
        self.completion_tokens = metrics.Counter(
            "scheduler_region_completion_tokens", description="Tokens generated.", tag_keys=keys
        )
        self.in_flight = metrics.Gauge(
            "scheduler_region_in_flight", description="Requests in flight at the gateway.", tag_keys=keys
        )
        self.ttft_s = metrics.Histogram(
            "scheduler_region_ttft_seconds", description="Time to first token at the gateway (s).",
            boundaries=TTFT_BOUNDARIES_S, tag_keys=keys,
        )

    def answered(self, usage: Usage | None, energy_j: float | None, ttft_s: float | None) -> None:
        self._inc(self.requests, 1)
        if usage is not None:
            self._inc(self.prompt_tokens, usage.prompt_tokens)
            self._inc(self.cached_tokens, usage.cached_tokens)
            self._inc(self.completion_tokens, usage.completion_tokens)
        if energy_j is not None:
            self._inc(self.energy_j, energy_j)
        if ttft_s is not None:
            self.ttft_s.observe(ttft_s, tags=self._tags)

    def failed(self) -> None:
        self._inc(self.errors, 1)

    def set_in_flight(self, count: int) -> None:
        self.in_flight.set(count, tags=self._tags)

    def _inc(self, counter: Any, value: float) -> None:
        # Counter.inc(0) raises ValueError.
        if value > 0:
            counter.inc(value, tags=self._tags)
