"""The region's custom metrics (``ray.util.metrics``; Ray exports them with a ``ray_`` prefix
on its metrics port, which the Ray dashboard's Prometheus service discovery lists)."""

from __future__ import annotations

from typing import Any

from scheduler.region.stream_assembler import Usage

TTFT_BOUNDARIES_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


class GatewayMetrics:
    """One per gateway (Ray registers a metric name once per process); every figure is tagged
    with the pool that served it."""

    def __init__(self, region: str) -> None:
        from ray.util import metrics

        self._region = region
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
        self.idle_j = metrics.Counter(
            "scheduler_region_idle_energy_joules",
            description="Metered GPU energy of intervals nothing ran in, by the pools that claim the GPU (J).",
            tag_keys=keys,
        )
        self.in_flight = metrics.Gauge(
            "scheduler_region_in_flight", description="Requests in flight at the gateway.", tag_keys=keys
        )
        self.refused = metrics.Counter(
            "scheduler_region_refused", description="Requests refused (no or bad dispatch ticket, not served).",
            tag_keys=("region", "status"),
        )
        self.ttft_s = metrics.Histogram(
            "scheduler_region_ttft_seconds", description="Time to first token at the gateway (s).",
            boundaries=TTFT_BOUNDARIES_S, tag_keys=keys,
        )

    def answered(self, pool: str, usage: Usage | None, energy_j: float | None, ttft_s: float | None) -> None:
        tags = self._tags(pool)
        self._inc(self.requests, 1, tags)
        if usage is not None:
            self._inc(self.prompt_tokens, usage.prompt_tokens, tags)
            self._inc(self.cached_tokens, usage.cached_tokens, tags)
            self._inc(self.completion_tokens, usage.completion_tokens, tags)
        if energy_j is not None:
            self._inc(self.energy_j, energy_j, tags)
        if ttft_s is not None:
            self.ttft_s.observe(ttft_s, tags=tags)

    def idle(self, pool: str, joules: float) -> None:
        self._inc(self.idle_j, joules, self._tags(pool))

    def failed(self, pool: str) -> None:
        self._inc(self.errors, 1, self._tags(pool))

    def refused_request(self, status: int) -> None:
        self.refused.inc(1, tags={"region": self._region, "status": str(status)})

    def set_in_flight(self, pool: str, count: int) -> None:
        self.in_flight.set(count, tags=self._tags(pool))

    def _tags(self, pool: str) -> dict[str, str]:
        return {"region": self._region, "pool": pool}

    @staticmethod
    def _inc(counter: Any, value: float, tags: dict[str, str]) -> None:
        # Counter.inc(0) raises ValueError.
        if value > 0:
            counter.inc(value, tags=tags)
