"""Live state of a plain vLLM region (kind ``vllm``), read from its servers' ``/metrics``.

A region that runs plain vLLM OpenAI servers (``vllm serve``, behind LiteLLM, vllm-router or
production-stack, or alone) has no RegionGateway to publish its live state. This sidecar
(``scheduler region scrape``) reads every server of every pool and publishes the same
``RegionLiveState`` record a Ray region's gateway publishes (``RegionStatePublisher``), so the
router's filters and scorers read both alike (docs/byo-vllm.md).

Per server, each pass: ``GET {url}/metrics`` (vLLM's Prometheus text, all engines and models
summed) and ``GET {url}/v1/models`` (the served names and their ``max_model_len``). Per pool,
over the servers that answered both:

    running          = sum vllm:num_requests_running
    queue_depth      = sum vllm:num_requests_waiting
    kv_cache_usage   = mean vllm:kv_cache_usage_perc over the servers (0..1)
    prefix_cache_hit_rate = d(vllm:prefix_cache_hits_total) / d(vllm:prefix_cache_queries_total)
                       since the previous pass (the last rate while no query came)
    prompt_tokens_rate = d(vllm:prompt_tokens_total) / dt
    arrival_rate     = (d(vllm:request_success_total) + d(running + waiting)) / dt
                       (requests that finished plus the growth of those in the engine)
    models           = the pool's models every answering server serves (by its served name),
                       each at min(max_context, the servers' max_model_len)
    replicas         = servers that answered

Both rates are averaged exponentially over ``RATE_WINDOW_S``, as the gateway averages its own.
A server that does not answer within the timeout is left out of its pool; a pool none of whose
servers answered is left out (the router then treats it as not served); the region is healthy
while one pool is published. Counters that went down (a server restarted) count from their new
value. No energy is measured: ``gpu_power_w`` and ``measured_j_per_token`` stay None, and the
router prices these pools with the energy model (``measurement_source: model``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from scheduler.fleet import Pool, Region, VllmServers
from scheduler.types import PoolLiveState, RegionLiveState

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
FINISHED = "vllm:request_success_total"
# The gauges a vLLM server always exports: without them a /metrics answer is not vLLM's.
REQUIRED = (RUNNING, WAITING, KV_CACHE_USAGE)
# Averaging window of the arrival rates (the gateway's, scheduler.region.gateway).
RATE_WINDOW_S = 10.0

# name{labels} value [timestamp]: the labels' quoted values may hold '}' and escaped quotes.
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')


class MetricsError(ValueError):
    """A ``/metrics`` answer that is not a vLLM server's."""


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> each metric's samples summed over their labels (engines,
    models, finish reasons). Comments, histograms' and summaries' series pass through by name."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise MetricsError(f"not a Prometheus sample line: {line[:120]!r}")
        try:
            value = float(match.group(3))
        except ValueError:
            raise MetricsError(f"not a number in {line[:120]!r}") from None
        if math.isfinite(value):
            sums[match.group(1)] = sums.get(match.group(1), 0.0) + value
    return sums


def engine_count(text: str) -> int:
    """How many engines (data-parallel ranks) a server's metrics describe: the samples of its
    KV-cache gauge, one per engine."""
    return sum(1 for line in text.splitlines() if line.startswith(KV_CACHE_USAGE + "{") or
               line.startswith(KV_CACHE_USAGE + " "))


@dataclass(frozen=True)
class ServerReading:
    """One server's answer to one pass."""

    url: str
    metrics: Mapping[str, float]
    # Its engines' mean KV-cache usage (0..1).
    kv_cache_usage: float
    # served model name -> max_model_len
    models: Mapping[str, int]


async def read_server(client: httpx.AsyncClient, url: str, timeout_s: float,
                      api_key: str | None = None) -> ServerReading:
    """``/metrics`` and ``/v1/models`` of one vLLM server (``httpx.HTTPError`` or
    ``MetricsError`` when it does not answer as vLLM does). ``api_key``: the servers' --api-key
    (vLLM guards /v1, not /metrics)."""
    base = url.rstrip("/")
    auth = {} if api_key is None else {"authorization": f"Bearer {api_key}"}
    metrics_answer, models_answer = await asyncio.gather(
        client.get(f"{base}/metrics", timeout=timeout_s),
        client.get(f"{base}/v1/models", timeout=timeout_s, headers=auth))
    metrics_answer.raise_for_status()
    models_answer.raise_for_status()
    text = metrics_answer.text
    metrics = parse_metrics(text)
    absent = [name for name in REQUIRED if name not in metrics]
    if absent:
        raise MetricsError(f"{base}/metrics has no {', '.join(absent)}: not a vLLM server's metrics")
    engines = max(1, engine_count(text))
    return ServerReading(url, metrics, metrics[KV_CACHE_USAGE] / engines, _served_models(base, models_answer.json()))


def _served_models(base: str, body: object) -> dict[str, int]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        raise MetricsError(f"{base}/v1/models: expected an OpenAI model list, got {str(body)[:120]!r}")
    served: dict[str, int] = {}
    for entry in data:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        limit = entry.get("max_model_len")
        # A server that does not say (not vLLM's /v1/models) is held to the config's limit.
        served[entry["id"]] = limit if isinstance(limit, int) and limit > 0 else 2**31 - 1
    return served


@dataclass
class _PoolCounters:
    """A pool's counter totals at the previous pass, and its averaged rates."""

    at: float
    totals: Mapping[str, float]
    in_engine: float
    hit_rate: float = 0.0
    arrival_rate: float = 0.0
    prompt_tokens_rate: float = 0.0


def _pool_models(pool: Pool, readings: list[ServerReading]) -> dict[str, int]:
    """The pool's models that every answering server serves, at the least context limit."""
    models: dict[str, int] = {}
    for deployment in pool.models:
        served = pool.served_model_name(deployment.name)
        limits = [reading.models.get(served) for reading in readings]
        if all(limit is not None for limit in limits):
            models[deployment.name] = min(deployment.max_context, *(limit for limit in limits if limit is not None))
    return models


@dataclass
class VllmRegionSource:
    """A ``StateSource`` (scheduler.region.publisher) for a region of kind ``vllm``: one pass
    over every server of every pool per call."""

    region: Region
    client: httpx.AsyncClient
    timeout_s: float = 1.0
    monotonic: Callable[[], float] = time.monotonic
    clock: Callable[[], float] = time.time
    _previous: dict[str, _PoolCounters] = field(default_factory=dict, init=False)
    # Servers whose last pass failed: a failure is logged when it starts, not on every pass.
    _down: set[str] = field(default_factory=set, init=False)

    def __post_init__(self) -> None:
        if self.region.kind != "vllm":
            raise ValueError(f"region {self.region.name!r} is of kind {self.region.kind!r}: its gateway publishes its "
                             "live state; only a region of kind 'vllm' is scraped")

    async def __call__(self) -> RegionLiveState:
        pools = [(pool, pool.vllm) for pool in self.region.pools if pool.vllm is not None]
        urls = [(pool.name, url, servers) for pool, servers in pools for url in servers.urls]
        answers = await asyncio.gather(*(self._read(url, servers) for _, url, servers in urls),
                                       return_exceptions=True)
        by_pool: dict[str, list[ServerReading]] = {pool.name: [] for pool, _ in pools}
        for (pool_name, url, _), answer in zip(urls, answers, strict=True):
            if isinstance(answer, ServerReading):
                by_pool[pool_name].append(answer)
                if url in self._down:
                    self._down.discard(url)
                    log.info("region %s: pool %s: server %s answers again", self.region.name, pool_name, url)
            elif isinstance(answer, httpx.HTTPError | ValueError):  # MetricsError, bad JSON included
                if url not in self._down:
                    self._down.add(url)
                    log.warning("region %s: pool %s: server %s not answering (left out until it does): %s",
                                self.region.name, pool_name, url, answer or type(answer).__name__)
            else:
                raise answer
        now = self.monotonic()
        published: dict[str, PoolLiveState] = {}
        for pool, _ in pools:
            readings = by_pool[pool.name]
            if readings:
                published[pool.name] = self._pool_state(pool, readings, now)
        return RegionLiveState(region=self.region.name, healthy=bool(published), observed_at=self.clock(),
                               pools=published)

    async def _read(self, url: str, servers: VllmServers) -> ServerReading:
        api_key = None
        if servers.api_key_env is not None:
            api_key = os.environ.get(servers.api_key_env)
            if not api_key:
                raise MetricsError(f"${servers.api_key_env}, the servers' API key, is not set here")
        return await read_server(self.client, url, self.timeout_s, api_key)

    def _pool_state(self, pool: Pool, readings: list[ServerReading], now: float) -> PoolLiveState:
        def total(name: str) -> float:
            return sum(reading.metrics.get(name, 0.0) for reading in readings)

        running, waiting = total(RUNNING), total(WAITING)
        totals = {name: total(name) for name in (PREFIX_HITS, PREFIX_QUERIES, PROMPT_TOKENS, FINISHED)}
        counters = self._advance(pool.name, now, totals, running + waiting)
        return PoolLiveState(
            queue_depth=int(waiting),
            running=int(running),
            kv_cache_usage=sum(reading.kv_cache_usage for reading in readings) / len(readings),
            prefix_cache_hit_rate=counters.hit_rate,
            arrival_rate=counters.arrival_rate,
            prompt_tokens_rate=counters.prompt_tokens_rate,
            models=_pool_models(pool, readings),
            replicas=len(readings),
        )

    def _advance(self, pool: str, now: float, totals: Mapping[str, float], in_engine: float) -> _PoolCounters:
        """The pool's rates after this pass (the first pass: the hit rate since the servers
        started, no arrival rates yet)."""
        previous = self._previous.get(pool)
        if previous is None:
            queries = totals[PREFIX_QUERIES]
            current = _PoolCounters(now, totals, in_engine,
                                    hit_rate=totals[PREFIX_HITS] / queries if queries > 0 else 0.0)
            self._previous[pool] = current
            return current

        def grown(name: str) -> float:
            # A counter that went down belongs to a restarted server: it counts from its new value.
            before, after = previous.totals[name], totals[name]
            return after - before if after >= before else after

        window = now - previous.at
        current = _PoolCounters(now, totals, in_engine, previous.hit_rate, previous.arrival_rate,
                                previous.prompt_tokens_rate)
        queries = grown(PREFIX_QUERIES)
        if queries > 0:
            current.hit_rate = min(1.0, grown(PREFIX_HITS) / queries)
        if window > 0:
            arrivals = max(0.0, grown(FINISHED) + in_engine - previous.in_engine) / window
            weight = 1.0 - math.exp(-window / RATE_WINDOW_S)
            current.arrival_rate += weight * (arrivals - current.arrival_rate)
            current.prompt_tokens_rate += weight * (grown(PROMPT_TOKENS) / window - current.prompt_tokens_rate)
        self._previous[pool] = current
        return current
