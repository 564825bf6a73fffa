"""``RegionGateway``: the ingress of a region's Ray Serve application.

It serves the OpenAI-compatible streaming API the router calls (``POST /v1/completions``,
``POST /v1/chat/completions``; ``GET /v1/models``, ``GET /health``, ``GET /state``), in front
of the region's vLLM replica (``RegionLLMServer``, reached through a ``DeploymentHandle``):

- maps the requested model (e.g. ``llama-3.1-8b``, served by the pool the replica stands
  for) to the model the replica runs (locally the tiny model) and back in every chunk;
- tracks the requests in flight (``InFlight``) and, where NVML sees GPUs, shares the
  measured energy among them;
- adds the ``energy`` object to the final usage event (``energy_report``);
- publishes the region's live state every ~1 s when it is given a shared store.

It never imports vLLM (the replica does), which keeps it small.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ray import serve
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from scheduler.config.schema import RegionConfig
from scheduler.energy.nvml import NvmlMeter, delta_mj
from scheduler.serve.energy_report import PoolEnergyProfile, energy_object
from scheduler.serve.inflight import InFlight
from scheduler.serve.metrics import GatewayMetrics
from scheduler.serve.publisher import RegionStatePublisher
from scheduler.serve.sse import StreamAssembler, sse_event
from scheduler.state import codec
from scheduler.types import PoolLiveState, RegionLiveState

log = logging.getLogger(__name__)

# Time constant of the published arrival rates' moving average.
RATE_WINDOW_S = 10.0


@dataclass(frozen=True)
class GatewaySettings:
    region: RegionConfig
    # The pool the local replica stands for, and the model the replica really runs.
    pool: str
    served_model: str
    # None: no in-gateway publisher (the stack bridges ``GET /state`` to its store instead).
    store_url: str | None = None
    namespace: str = "local"
    publish_interval_s: float = 1.0
    state_ttl_s: float = 60.0
    meter_interval_s: float = 0.2
    engine_timeout_s: float = 2.0


def openai_error(message: str, status: int, kind: str, code: str | int | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code if code is not None else status}}
    return JSONResponse(body, status_code=status)


async def _chain(first: list[Any], rest: AsyncIterator[list[Any]]) -> AsyncIterator[list[Any]]:
    yield first
    async for batch in rest:
        yield batch


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
class RegionGateway:
    # Serve awaits an async constructor, so the background tasks start on the replica's loop.
    async def __init__(self, llm: Any, settings: GatewaySettings) -> None:  # type: ignore[misc]
        self._llm = llm
        self._settings = settings
        pool = next(p for p in settings.region.pools if p.name == settings.pool)
        self._profile = PoolEnergyProfile.of(pool)
        self._in_flight = InFlight(clock=time.monotonic)
        self._metrics = GatewayMetrics(settings.region.name, settings.pool)
        self._meter = NvmlMeter()
        self._meter.open()
        self._power_w: float | None = None
        self._measured_j_total = 0.0
        self._last_rate: tuple[float, float] | None = None  # (measured J, generated tokens)
        self._last_arrivals: tuple[float, int, float] | None = None  # (monotonic s, requests, prompt tokens)
        self._rates = (0.0, 0.0)  # published arrival rates: requests/s, prompt tokens/s
        self._tasks: list[asyncio.Task[None]] = []
        if self._meter.available:
            self._tasks.append(asyncio.create_task(self._meter_loop()))
        self._store: Any = None
        if settings.store_url is not None:
            from scheduler.state.factory import open_store

            self._store = open_store(settings.store_url, settings.namespace)
            publisher = RegionStatePublisher(
                region=settings.region.name, source=self.live_state, store=self._store,
                interval_s=settings.publish_interval_s, ttl_s=settings.state_ttl_s,
            )
            self._tasks.append(asyncio.create_task(publisher.run()))
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/v1/completions"): lambda r: self._generate(r, "stream_completions"),
            ("POST", "/v1/chat/completions"): lambda r: self._generate(r, "stream_chat"),
            ("GET", "/v1/models"): self._models,
            ("GET", "/health"): self._health,
            ("GET", "/state"): self._state,
        }

    async def __call__(self, request: Request) -> Response:
        path = request.scope["path"]
        root = request.scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        handler = self._routes.get((request.method, path.rstrip("/") or "/"))
        if handler is None:
            return openai_error(f"no route {request.method} {path}", 404, "NotFoundError")
        return await handler(request)

    # --- the OpenAI API ---------------------------------------------------------------

    async def _generate(self, request: Request, method: str) -> Response:
        try:
            body = await request.json()
        except json.JSONDecodeError as exc:
            return openai_error(f"request body is not JSON: {exc}", 400, "BadRequestError")
        if not isinstance(body, dict):
            return openai_error("request body must be a JSON object", 400, "BadRequestError")
        model = body.get("model")
        if not isinstance(model, str) or not self._profile.serves(model):
            served = ", ".join(self._profile.deployments)
            return openai_error(f"model {model!r} is not served by pool {self._settings.pool} "
                                f"of {self._settings.region.name} (served: {served})", 404,
                                "NotFoundError", "model_not_found")
        if body.get("stream") is not True:
            return openai_error("this region streams only: set \"stream\": true", 400, "BadRequestError")
        scheduler_info = body.pop("x_scheduler", None)
        engine_body = {**body, "model": self._settings.served_model,
                       "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
        request_id = uuid.uuid4().hex
        self._in_flight.start(request_id)
        self._metrics.set_in_flight(self._in_flight.count)
        try:
            stream = getattr(self._llm.options(stream=True), method).remote(engine_body)
            first = await stream.__anext__()
        except Exception as exc:
            self._end(request_id)
            self._metrics.failed()
            log.warning("region %s: engine failed before streaming: %s", self._settings.region.name, exc)
            return openai_error(f"engine unavailable: {exc}", 503, "ServiceUnavailableError")
        error = next((item for item in first if isinstance(item, dict)), None)
        if error is not None:
            self._end(request_id)
            self._metrics.failed()
            status = error.get("error", {}).get("code", 500)
            return JSONResponse(error, status_code=status if isinstance(status, int) else 500)
        if scheduler_info:
            log.debug("request %s for decision %s", request_id, scheduler_info)
        assembler = StreamAssembler(requested_model=model, clock=time.monotonic)
        return StreamingResponse(
            self._relay(request_id, model, first, stream, assembler, time.monotonic()),
            media_type="text/event-stream",
        )

    async def _relay(
        self, request_id: str, model: str, first: list[Any], stream: Any,
        assembler: StreamAssembler, started: float,
    ) -> AsyncIterator[bytes]:
        finished = False
        try:
            async for items in _chain(first, stream):
                for item in items:
                    out = sse_event(item) if isinstance(item, dict) else assembler.feed(item)
                    if out is not None:
                        yield out
            share = self._end(request_id)
            finished = True
            usage = assembler.usage
            energy = energy_object(self._profile, model, usage, share) if usage is not None else None
            ttft = assembler.first_token_at - started if assembler.first_token_at is not None else None
            self._metrics.answered(usage, energy["energy_j"] if energy else None, ttft)
            yield assembler.finish(energy)
        finally:
            if not finished:
                # Client gone or engine failed mid-stream: the engine request is cancelled.
                self._end(request_id)
                self._metrics.failed()

    def _end(self, request_id: str) -> Any:
        share = self._in_flight.finish(request_id)
        self._metrics.set_in_flight(self._in_flight.count)
        return share

    async def _models(self, request: Request) -> Response:
        created = int(time.time())
        data = [{"id": name, "object": "model", "created": created, "owned_by": self._settings.region.name}
                for name in self._profile.deployments]
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        state = await self.live_state()
        healthy = state is not None and state.healthy
        return JSONResponse({"healthy": healthy}, status_code=200 if healthy else 503)

    async def _state(self, request: Request) -> Response:
        state = await self.live_state()
        return Response(codec.encode_region_state(state), media_type="application/json")

    # --- live state -------------------------------------------------------------------

    async def live_state(self) -> RegionLiveState:
        """What the region publishes: engine figures, requests in flight, GPU power."""
        settings = self._settings
        try:
            stats: dict[str, float] = await asyncio.wait_for(
                self._llm.live_stats.remote(), timeout=settings.engine_timeout_s
            )
            healthy = True
        except Exception as exc:
            log.warning("region %s: engine not answering (%s): reporting unhealthy", settings.region.name, exc)
            stats, healthy = {}, False
        in_flight = self._in_flight.count
        running = min(int(stats.get("running", 0)), in_flight)
        arrival_rate, prompt_rate = self._arrival_rates(stats.get("prompt_tokens_total"))
        pool = PoolLiveState(
            queue_depth=in_flight - running,
            running=running,
            kv_cache_usage=float(stats.get("kv_cache_usage", 0.0)),
            prefix_cache_hit_rate=float(stats.get("prefix_cache_hit_rate", 0.0)),
            gpu_power_w=self._power_w,
            measured_j_per_token=self._j_per_token(stats.get("generation_tokens_total")),
            arrival_rate=arrival_rate,
            prompt_tokens_rate=prompt_rate,
        )
        return RegionLiveState(
            region=settings.region.name, healthy=healthy, observed_at=time.time(), pools={settings.pool: pool}
        )

    def _arrival_rates(self, prompt_total: float | None) -> tuple[float, float]:
        """Requests started and prompt tokens the engine prefilled per second, averaged
        exponentially over ``RATE_WINDOW_S`` (one publication interval alone is too noisy)."""
        now, started = time.monotonic(), self._in_flight.started_total
        previous = self._last_arrivals
        self._last_arrivals = (now, started, prompt_total or 0.0)
        if previous is None or now <= previous[0]:
            return self._rates
        window = now - previous[0]
        prompt_rate = max(0.0, (prompt_total or 0.0) - previous[2]) / window if prompt_total is not None else 0.0
        weight = 1.0 - math.exp(-window / RATE_WINDOW_S)
        arrivals, prompts = self._rates
        self._rates = (arrivals + weight * ((started - previous[1]) / window - arrivals),
                       prompts + weight * (prompt_rate - prompts))
        return self._rates

    def _j_per_token(self, generated_total: float | None) -> float | None:
        """Measured J per generated token since the previous publication (None unmeasured)."""
        if not self._meter.available or generated_total is None:
            return None
        previous, self._last_rate = self._last_rate, (self._measured_j_total, generated_total)
        if previous is None or generated_total <= previous[1]:
            return None
        return (self._measured_j_total - previous[0]) / (generated_total - previous[1])

    async def _meter_loop(self) -> None:
        before = self._meter.read()
        while True:
            await asyncio.sleep(self._settings.meter_interval_s)
            after = self._meter.read()
            if before is not None and after is not None:
                joules = sum(delta_mj(before, after)) / 1000.0
                self._power_w = after.total_power_w
                if self._in_flight.count:
                    self._measured_j_total += joules
                self._in_flight.add_measured_energy(joules)
            before = after if after is not None else before

    async def __del__(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._store is not None:
            await self._store.close()
        self._meter.close()
