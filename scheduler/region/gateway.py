"""``RegionGateway``: the ingress of a region's Ray Serve application.

It serves the OpenAI-compatible streaming API the router calls (``POST /v1/completions``,
``POST /v1/chat/completions``; ``GET /v1/models``, ``GET /health``, ``GET /state``), in front
of one vLLM deployment per model of each pool (``RegionLLMServer``, reached through a
``DeploymentHandle``; locally one stand-in per pool):

- admits only requests that carry a valid dispatch ticket (``scheduler.tickets``): signed
  for this region, unexpired, used once, and matching the request (pool, model, max_tokens,
  prompt); without one, 401; with one that does not match, 403. Tickets can be turned off
  for development (``tickets="disabled"``; a warning at every start);
- runs the request on the pool the ticket names, on that pool's deployment of the requested
  model (each model of a pool has its own, scaled on its own; locally one stand-in engine
  serves every model of its pool), and refuses a pool or model it does not serve (404
  ``pool_not_served`` / ``model_not_found``);
- maps the requested model (e.g. ``llama-3.1-8b``) to the model its deployment's engine runs
  (locally the tiny model) and back in every chunk;
- tracks the requests in flight (``InFlight``): the replica each runs on and that replica's
  running batch (the replica's reports, first and last item of every stream), the token
  counts the engine streams, and, where NVML sees this node's GPUs, each GPU's measured
  energy split among the requests on it by rule "predicted-share-v1"
  (``scheduler.energy.attribution``; idle intervals apart, per pool; ``GET /energy`` shows
  the recent intervals);
- adds the ``energy`` object to the final usage event (``energy_report``); for every ticket it
  signs a receipt on the engine's own token counts and appends it to the store's ``receipts``
  stream (direct mode: also in the final event, for the client), a partial one when the stream
  is cut (the client or the router went away or cancelled, the engine failed): the prompt the
  engine prefilled, also when the client left before the first token, and the tokens generated
  so far (``docs/billing.md``);
- publishes the region's live state (per pool: load, models served and their context
  limits, warm and starting replicas as Ray Serve's controller counts them, summed and per
  model) every ~1 s when it is given a shared store. A deployment's engine is asked for its
  figures only while it has had requests since its last answer: an idle deployment's replicas
  get no call from the gateway, so Ray Serve's autoscaler sees them idle and scales them down
  (to zero where allowed); a model at zero is published with no warm replica
  (``scheduler.region.warmth``);
- records the prefix keys (``x_scheduler.prefix_key``) its pools served with prefix-cache hits
  (the engine's ``cached_tokens``) and publishes them with a TTL (``PrefixWarmPublisher``);
- at start, sets each served pool's GPU power cap through NVML, or dry-runs it without a GPU
  (``scheduler.region.power_caps``; ``GET /power-caps`` shows what it did), and puts the
  limits it changed back when it stops.

It never imports vLLM (the replica does), which keeps it small.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import math
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import ray
from ray import serve
from ray.exceptions import ActorDiedError, RayTaskError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from scheduler import signed_region_receipt, tickets
from scheduler.config.schema import PoolConfig, RegionConfig
from scheduler.energy.nvml import NvmlMeter
from scheduler.region.energy_report import PoolEnergyProfile, RegionPricing, energy_object
from scheduler.region.idle_windows import IdleWindows
from scheduler.region.inflight import InFlight, RequestShare
from scheduler.region.metrics import GatewayMetrics
from scheduler.region.power_caps import PowerCapper, RegionCapReport, apply_region_caps
from scheduler.region.prefix_publisher import PrefixWarmPublisher
from scheduler.region.publisher import RegionStatePublisher
from scheduler.region.replica_report import ReplicaReport
from scheduler.region.stream_assembler import StreamAssembler, Usage, sse_event
from scheduler.region.warmth import DeploymentReplicas, deployment_replicas
from scheduler.state import codec
from scheduler.state.prefix_warm import PrefixHits
from scheduler.state.store import StateUnavailable
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.tickets import CLOCK_SKEW_S, RegionKeys, Ticket, TicketKeyRing, TicketRejected
from scheduler.types import ModelReplicas, PoolLiveState, RegionLiveState

log = logging.getLogger(__name__)

# Time constant of the published arrival rates' moving average.
RATE_WINDOW_S = 10.0
# Signed receipts kept while the store is unreachable (oldest dropped beyond, and logged).
RECEIPT_OUTBOX = 10_000
# At shutdown, how long the receipts of the streams it cut get to reach the store.
RECEIPT_FLUSH_S = 5.0
# How a stats call ends when the pool's engine cannot serve: the replica's method raised (its
# health check: the engine is dead), or the replica's process died. Anything else that is not
# an answer (a timeout, a call cancelled or not yet routed) is an engine slow to answer.
ENGINE_FAILED = (RayTaskError, ActorDiedError)


@dataclass(frozen=True)
class PoolEngine:
    """What one of a pool's deployments runs: the engine's model (one of the pool's models, or
    a stand-in for all of them: ``served_models``) and its context limit."""

    served_model: str
    max_model_len: int


# One deployment of the application: (pool, the model its engine serves).
Deployment = tuple[str, str]


@dataclass(frozen=True)
class GatewaySettings:
    region: RegionConfig
    # The pools this application serves, each with its deployments (``llms`` of the gateway:
    # pool -> served model -> handle), one per model of the pool or a single stand-in.
    pools: Mapping[str, tuple[PoolEngine, ...]]
    # None: no in-gateway publisher (the stack bridges ``GET /state`` to its store instead).
    store_url: str | None = None
    namespace: str = "local"
    publish_interval_s: float = 1.0
    state_ttl_s: float = 60.0
    meter_interval_s: float = 0.2
    engine_timeout_s: float = 2.0
    # A pool whose engine gets no stats call answered in time keeps its last answer published
    # this long (EngineAnswers): as long as Serve waits on a replica's health check before it
    # calls the replica unhealthy (health_check_timeout_s, 30 s by default). The trade-off:
    # shorter, a few slow calls on a loaded host take a serving pool out of the router's offer
    # and requests only it can take are refused as unschedulable; longer, a hung engine is
    # offered that much longer (its requests fail over to the next candidate).
    engine_grace_s: float = 30.0
    tickets: Literal["required", "disabled"] = "required"
    # The region's ticket keys; None: read from the file $SCHEDULER_TICKET_KEYS_FILE names.
    ticket_keys: RegionKeys | None = None
    # How far this region's clock may be behind or ahead of the routers' (scheduler.tickets.check).
    ticket_clock_skew_s: float = CLOCK_SKEW_S
    # The billing window of idle energy: each pool's idle joules in it are shared among the
    # tenants that used the pool (scheduler.ledger.idle).
    idle_window_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.ticket_clock_skew_s <= 300.0:
            raise ValueError(f"ticket_clock_skew_s must be within [0, 300] s, got {self.ticket_clock_skew_s}")


@dataclass
class EngineAnswers:
    """Each deployment's last stats answer, and whether it is published on it (None: left out).

    Whether a deployment is served is not its stats call's latency: a call that gets no answer in
    time is a slow engine (a loaded host, a long prefill holding its replica), which still
    serves, so its last answer stands for ``grace_s`` after it came; only an engine silent that
    long counts as gone. A call that fails (``ENGINE_FAILED``: the engine or its replica says
    it cannot serve) leaves the deployment out at once, until it answers again. A deployment that
    never answered is not up yet.
    """

    grace_s: float
    _last: dict[Hashable, tuple[float, Mapping[str, Any]]] = field(default_factory=dict)

    def standing(self, deployment: Hashable, answer: Mapping[str, Any] | BaseException, now: float) -> Mapping[str, Any] | None:
        if not isinstance(answer, BaseException):
            self._last[deployment] = (now, answer)
            return answer
        if isinstance(answer, ENGINE_FAILED):
            self._last.pop(deployment, None)
            return None
        last = self._last.get(deployment)
        if last is None or now - last[0] > self.grace_s:
            return None
        log.info("engine of %s slow to answer: its answer of %.1f s ago stands", deployment, now - last[0])
        return last[1]

    def last(self, deployment: Hashable) -> Mapping[str, Any] | None:
        """The deployment's last answer (None: it never answered, or its engine failed since)."""
        last = self._last.get(deployment)
        return None if last is None else last[1]

    def forget(self, deployment: Hashable) -> None:
        """The deployment's replicas went away (scaled to zero): the next one must answer afresh."""
        self._last.pop(deployment, None)


def served_models(pool: PoolConfig, engine: PoolEngine) -> dict[str, int]:
    """Requested model -> context limit. An engine running one of the pool's models serves
    that model; a stand-in (the tiny model locally) serves every model of the pool."""
    names = {m.name: m for m in pool.models}
    chosen = [names[engine.served_model]] if engine.served_model in names else list(pool.models)
    return {m.name: min(m.max_context, engine.max_model_len) for m in chosen}


@dataclass(frozen=True)
class PublishedDeployment:
    """One deployment as its pool's live state is made of it: Serve's counts of its replicas
    (None: not known), its engine's answer (None: it has no warm replica) and whether that
    answer is fresh."""

    key: Deployment
    counts: DeploymentReplicas | None
    stats: Mapping[str, Any] | None
    fresh: bool


def _weighed(answers: list[Mapping[str, Any]], weights: list[float], figure: str) -> float:
    """The answers' ``figure`` averaged with ``weights``."""
    return sum(w * float(a.get(figure, 0.0)) for a, w in zip(answers, weights, strict=True)) / sum(weights)


def openai_error(message: str, status: int, kind: str, code: str | int | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": code if code is not None else status}}
    return JSONResponse(body, status_code=status)


def refusal(exc: TicketRejected) -> JSONResponse:
    kind = "AuthenticationError" if exc.status == 401 else "PermissionDeniedError"
    return openai_error(exc.reason, exc.status, kind, "invalid_ticket" if exc.status == 401 else "ticket_mismatch")


async def _chain(first: list[Any], rest: AsyncIterator[list[Any]]) -> AsyncIterator[list[Any]]:
    yield first
    async for batch in rest:
        yield batch


async def _primed(head: bytes, relay: AsyncGenerator[bytes, None]) -> AsyncIterator[bytes]:
    """``head`` (the relay's first event), then the rest of ``relay``; closed, it closes ``relay``."""
    try:
        yield head
        async for out in relay:
            yield out
    finally:
        await relay.aclose()


class ReplayGuard:
    """Single use of tickets: SET NX in the shared store (every replica of every region sees
    it). While the store is unreachable it falls back to this replica's memory: a ticket can
    then be replayed against another replica within its (<= 30 s) lifetime; that is the
    trade-off for serving through a store outage."""

    def __init__(self, store: Any) -> None:
        self._store = store
        # Tickets this replica admitted, until they expire: (expires, key) in admission order
        # (expiries grow with it, near enough: each is admission + ticket lifetime) and a set.
        self._order: collections.deque[tuple[float, str]] = collections.deque()
        self._seen: set[str] = set()
        self._store_down = False

    async def first_use(self, ticket: Ticket, now: float) -> bool:
        ttl = max(1.0, ticket.expires_at - now + 5.0)
        while self._order and self._order[0][0] < now:
            self._seen.discard(self._order.popleft()[1])
        if ticket.use_key in self._seen:
            return False
        if self._store is not None:
            try:
                first = bool(await self._store.set_nx(ticket.use_key, b"1", ttl))
                if self._store_down:
                    log.info("ticket store reachable again")
                self._store_down = False
                if not first:
                    return False
            except StateUnavailable as exc:
                if not self._store_down:
                    log.warning("ticket store unreachable (%s): single use is held per replica until it returns", exc)
                self._store_down = True
        self._order.append((now + ttl, ticket.use_key))
        self._seen.add(ticket.use_key)
        return True


@serve.deployment(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256)
class RegionGateway:
    # Serve awaits an async constructor, so the background tasks start on the replica's loop.
    async def __init__(self, llms: Mapping[str, Mapping[str, Any]],  # type: ignore[misc]
                       settings: GatewaySettings) -> None:
        region = settings.region
        configs = {p.name: p for p in region.pools}
        engines = {(name, engine.served_model): engine for name, pool in settings.pools.items() for engine in pool}
        handles = {(name, model): handle for name, pool in llms.items() for model, handle in pool.items()}
        unknown = sorted(set(settings.pools) - set(configs))
        if unknown or set(handles) != set(engines):
            raise ValueError(f"region {region.name}: deployments {sorted(engines)} / handles {sorted(handles)} "
                             f"do not match, or are not of the region's pools {sorted(configs)}")
        self._llms: dict[Deployment, Any] = handles
        self._settings = settings
        # deployment -> its name in Serve (for the replica counts of ``serve.status()``)
        self._deployments = {key: str(getattr(handle, "deployment_name", key)) for key, handle in handles.items()}
        # deployment -> requested model -> its context limit (config's and engine's)
        self._served = {key: served_models(configs[key[0]], engine) for key, engine in engines.items()}
        # pool -> requested model -> the deployment serving it
        self._route: dict[str, dict[str, Deployment]] = {name: {} for name in settings.pools}
        for key, models in self._served.items():
            for model in models:
                if model in self._route[key[0]]:
                    raise ValueError(f"region {region.name}: pool {key[0]}: model {model} is served by two "
                                     f"deployments ({self._route[key[0]][model][1]}, {key[1]})")
                self._route[key[0]][model] = key
        self._models = {name: {model: self._served[key][model] for model, key in route.items()}
                        for name, route in self._route.items()}
        # Per deployment: requests open and started there (the gateway's counts), and how many
        # had started when its engine last answered.
        self._open: Counter[Deployment] = Counter()
        self._started: Counter[Deployment] = Counter()
        self._asked_at_started: dict[Deployment, int] = {}
        self._deployment_of: dict[str, Deployment] = {}  # request id -> the deployment running it
        self._profiles = {name: PoolEnergyProfile.of(configs[name]) for name in settings.pools}
        self._metrics = GatewayMetrics(region.name)
        self._keys = self._load_keys()
        self._meter = NvmlMeter()
        self._meter.open()
        self._power_caps: RegionCapReport | None = None
        self._capper: PowerCapper | None = None
        try:
            self._power_caps, self._capper = apply_region_caps(region, list(settings.pools))
        except Exception:  # the caps are an energy lever, not a reason to refuse to serve
            log.exception("region %s: power caps not set", region.name)
        if self._power_caps is not None:
            # The model's bill of a pool is for its GPUs at the cap the region sets.
            targets = {p.pool: p.target_w for p in self._power_caps.pools}
            self._profiles = {name: PoolEnergyProfile.of(configs[name], cap_w=targets.get(name))
                              for name in settings.pools}
        # The GPUs NVML sees are this Ray node's ("" outside Ray: tests).
        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
        self._idle = IdleWindows(region.name, region.pue, settings.idle_window_s)
        self._flight = InFlight(clock=time.monotonic, node=node, on_idle=self._on_idle,
                                pricing=RegionPricing(self._profiles) if self._meter.available else None)
        self._power_w: float | None = None
        self._last_rate: tuple[float, float] | None = None  # (measured J, generated tokens)
        self._engine_answers = EngineAnswers(settings.engine_grace_s)
        self._last_arrivals: dict[str, tuple[float, int, float]] = {}  # pool -> (monotonic s, requests, prompt tokens)
        self._rates: dict[str, tuple[float, float]] = {}  # pool -> published rates: requests/s, prompt tokens/s
        self._tasks: list[asyncio.Task[None]] = []
        if self._meter.available:
            self._tasks.append(start_loop(self._meter_loop, "energy-meter"))
        self._store: Any = None
        # The prefix keys each pool served with prefix-cache hits (docs/affinity.md).
        self._prefix_hits = PrefixHits()
        if settings.store_url is not None:
            from scheduler.state.factory import open_store

            self._store = open_store(settings.store_url, settings.namespace)
            publisher = RegionStatePublisher(
                region=region.name, source=self.live_state, store=self._store,
                interval_s=settings.publish_interval_s, ttl_s=settings.state_ttl_s,
            )
            self._tasks.append(start_loop(publisher.run, "state-publisher"))
            warm = PrefixWarmPublisher(region=region.name, hits=self._prefix_hits, store=self._store,
                                       interval_s=settings.publish_interval_s)
            self._tasks.append(start_loop(warm.run, "prefix-warm-publisher"))
        self._replay = ReplayGuard(self._store)
        self._outbox: collections.deque[dict[str, str]] = collections.deque(maxlen=RECEIPT_OUTBOX)
        self._outbox_wake = asyncio.Event()
        # Receipts of cut streams waiting for the engine's count of the prompt.
        self._counting: set[asyncio.Task[None]] = set()
        if self._store is not None:
            self._tasks.append(start_loop(self._receipt_writer, "receipt-writer"))
            if self._keys is not None:
                self._tasks.append(start_loop(self._idle_writer, "idle-windows"))
        self._routes: dict[tuple[str, str], Callable[[Request], Awaitable[Response]]] = {
            ("POST", "/v1/completions"): lambda r: self._generate(r, "stream_completions"),
            ("POST", "/v1/chat/completions"): lambda r: self._generate(r, "stream_chat"),
            ("GET", "/v1/models"): self._list_models,
            ("GET", "/health"): self._health,
            ("GET", "/state"): self._state,
            ("GET", "/power-caps"): self._power_caps_view,
            ("GET", "/energy"): self._energy_view,
        }

    def _load_keys(self) -> RegionKeys | None:
        settings = self._settings
        region = settings.region.name
        if settings.tickets == "disabled":
            log.warning("region %s: dispatch tickets are DISABLED: anyone who reaches this endpoint can run "
                        "requests on any pool, unbilled (development only)", region)
            return None
        if settings.ticket_keys is not None:
            return settings.ticket_keys
        ring = TicketKeyRing.from_env()
        if ring is None:
            raise ValueError(f"region {region}: tickets are required but no keys were given: set "
                             f"${tickets.KEYS_FILE_ENV} to the region's key file or ${tickets.KEYS_ENV} to its "
                             "content (or disable tickets for development)")
        return ring.of(region)

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

    def _admit(self, request: Request, body: dict[str, Any], scheduler_info: Any, endpoint: str,
               ) -> tuple[str, Ticket | None]:
        """(pool, ticket) of an admissible request (``body``: its ``tickets.engine_body``, sent to
        ``endpoint``); ``TicketRejected`` otherwise."""
        asked_pool = scheduler_info.get("pool") if isinstance(scheduler_info, dict) else None
        if asked_pool is not None and not isinstance(asked_pool, str):
            raise TicketRejected(403, f"x_scheduler.pool must be a string, got {asked_pool!r}")
        if self._keys is None:
            return asked_pool or next(iter(self._settings.pools)), None
        token = request.headers.get(tickets.HEADER)
        if not token:
            raise TicketRejected(401, f"no dispatch ticket: send the router's ticket in the {tickets.HEADER} header")
        ticket = Ticket.verify(self._keys, token)
        tickets.check(ticket, region=self._settings.region.name, now=time.time(), body=body, pool=asked_pool,
                      endpoint=endpoint, clock_skew_s=self._settings.ticket_clock_skew_s)
        return ticket.pool, ticket

    async def _generate(self, request: Request, method: str) -> Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return openai_error(f"request body is not JSON: {exc}", 400, "BadRequestError")
        if not isinstance(body, dict):
            return openai_error("request body must be a JSON object", 400, "BadRequestError")
        model = body.get("model")
        if not isinstance(model, str):
            return openai_error(f"model must be a string, got {model!r}", 400, "BadRequestError")
        scheduler_info = body.pop("x_scheduler", None)
        region = self._settings.region.name
        endpoint = tickets.CHAT_COMPLETIONS if method == "stream_chat" else tickets.COMPLETIONS
        try:
            # Only the fields an engine request may carry, in the shape a ticket binds: the
            # engine runs exactly what the router decided on (scheduler.tickets.engine_body).
            body = tickets.engine_body(body)
            pool, ticket = self._admit(request, body, scheduler_info, endpoint)
        except TicketRejected as exc:
            self._metrics.refused_request(exc.status)
            log.warning("region %s: refused a request: %s", region, exc.reason)
            return refusal(exc)
        if pool not in self._models:
            self._metrics.refused_request(404)
            return openai_error(f"pool {pool!r} is not served by region {region} (served: "
                                f"{', '.join(self._models)})", 404, "NotFoundError", "pool_not_served")
        if model not in self._models[pool]:
            self._metrics.refused_request(404)
            return openai_error(f"model {model!r} is not served by pool {pool} of {region} "
                                f"(served: {', '.join(self._models[pool])})", 404, "NotFoundError", "model_not_found")
        if body.get("stream") is not True:
            return openai_error("this region streams only: set \"stream\": true", 400, "BadRequestError")
        if ticket is not None and not await self._replay.first_use(ticket, time.time()):
            self._metrics.refused_request(403)
            log.warning("region %s: refused a replayed ticket (decision %s)", region, ticket.decision_id)
            return refusal(TicketRejected(403, f"ticket already used (decision {ticket.decision_id})"))
        asked_options = body.get("stream_options") or {}
        # The usage so far on every chunk: the token counts the measured energy is split by
        # (InFlight), and what a stream cut before its end is billed on (the engine's counts).
        deployment = self._route[pool][model]
        engine_body = {**body, "model": deployment[1],
                       "stream_options": {**asked_options, "include_usage": True, "continuous_usage_stats": True}}
        if ticket is not None:
            # The tenant's own prefix cache: its KV never serves another tenant's request, and its
            # cached_tokens never tell it what another tenant's prompts began with.
            engine_body["cache_salt"] = self._cache_salt(ticket.tenant)
        request_id = uuid.uuid4().hex
        hinted = scheduler_info.get("prefix_key") if isinstance(scheduler_info, dict) else None
        prefix_key = hinted if isinstance(hinted, str) and hinted else None
        self._start(pool, request_id, model)
        called = time.monotonic()
        try:
            # The prefix key picks the pool's replica (scheduler.region.prefix_router).
            stream = getattr(self._llms[deployment].options(stream=True), method).remote(engine_body,
                                                                                          prefix_key=prefix_key)
            first = await self._first_batch(request_id, stream)
        except asyncio.CancelledError:
            # The client left while the engine prefilled (Serve cancels the call): the prefill is billed.
            share = self._end(pool, request_id)
            self._metrics.failed(pool)
            if ticket is not None:
                self._bill_cut(ticket, pool, model, method, engine_body, None, share, None, called, "cancelled")
            raise
        except Exception as exc:
            self._end(pool, request_id)
            self._metrics.failed(pool)
            log.warning("region %s: engine of pool %s failed before streaming: %s", region, pool, exc)
            return openai_error(f"engine unavailable: {exc}", 503, "ServiceUnavailableError")
        error = next((item for item in first if isinstance(item, dict)), None)
        if error is not None:
            self._end(pool, request_id)
            self._metrics.failed(pool)
            status = error.get("error", {}).get("code", 500)
            return JSONResponse(error, status_code=status if isinstance(status, int) else 500)
        assembler = StreamAssembler(requested_model=model, clock=time.monotonic,
                                    on_progress=lambda prompt, completion: self._flight.progress(
                                        request_id, prompt, completion),
                                    keep_progress=bool(isinstance(asked_options, dict)
                                                       and asked_options.get("continuous_usage_stats")))
        relay = self._relay(pool, request_id, model, ticket, first, self._reported(request_id, stream), assembler,
                            time.monotonic(), method, engine_body, prefix_key)
        # The relay runs to its first event here, so that its end path bills the stream however it
        # ends: the server may drop the response unread (its client left during the prefill), and
        # a generator never started runs no finally.
        head = await anext(relay)
        return StreamingResponse(_primed(head, relay), media_type="text/event-stream",
                                 headers={"x-scheduler-pool": pool})

    async def _first_batch(self, request_id: str, stream: Any) -> list[Any]:
        """The stream's first batch after the replica's report, which places the request."""
        first: list[Any] = await stream.__anext__()
        report = ReplicaReport.of_batch(first)
        if report is None:
            return first
        self._flight.report(request_id, report)
        following: list[Any] = await stream.__anext__()
        return following

    async def _reported(self, request_id: str, stream: Any) -> AsyncIterator[list[Any]]:
        """The stream without the replica's closing report, which goes to the accounts."""
        async for items in stream:
            report = ReplicaReport.of_batch(items)
            if report is None:
                yield items
            else:
                self._flight.report(request_id, report)

    async def _relay(
        self, pool: str, request_id: str, model: str, ticket: Ticket | None, first: list[Any], stream: Any,
        assembler: StreamAssembler, started: float, method: str, engine_body: Mapping[str, Any],
        prefix_key: object = None,
    ) -> AsyncGenerator[bytes, None]:
        finished = False
        # What cut the stream, if it is cut: the client (or the router) went away or cancelled
        # (the generator is closed or cancelled), unless the engine failed.
        end_reason = "cancelled"
        try:
            async for items in _chain(first, stream):
                for item in items:
                    out = sse_event(item) if isinstance(item, dict) else assembler.feed(item)
                    if out is not None:
                        yield out
            share = self._end(pool, request_id)
            finished = True
            usage = assembler.usage
            if usage is not None:
                self._prefix_hits.record(pool, prefix_key, usage.cached_tokens, time.time())
            energy = energy_object(self._profiles[pool], model, usage, share) if usage is not None else None
            ttft = assembler.first_token_at - started if assembler.first_token_at is not None else None
            self._metrics.answered(pool, usage, energy["energy_j"] if energy else None, ttft)
            receipt = None
            if ticket is not None:
                # In proxy mode too: the router's own receipt may never be booked (it died).
                claims = self._receipt(ticket, energy, usage, ttft, time.monotonic() - started)
                receipt = claims if ticket.mode == "direct" else None
            yield assembler.finish(energy, receipt)
        except Exception:
            end_reason = "region-error"
            raise
        finally:
            if not finished:
                # The engine request is cancelled with the stream: bill what it did until now.
                share = self._end(pool, request_id)
                self._metrics.failed(pool)
                if ticket is not None:
                    ttft = assembler.first_token_at - started if assembler.first_token_at is not None else None
                    self._bill_cut(ticket, pool, model, method, engine_body, assembler, share, ttft, started,
                                   end_reason)

    def _bill_cut(self, ticket: Ticket, pool: str, model: str, method: str, engine_body: Mapping[str, Any],
                  assembler: StreamAssembler | None, share: RequestShare, ttft_s: float | None, started: float,
                  end_reason: str) -> None:
        """The partial receipt of a stream cut before its end, on the engine's counts: at once
        when it reported usage (every chunk carries it), else once the engine has counted the
        prompt it prefilled (nothing may be awaited here: the stream's task is being cancelled
        or closed)."""
        counted = assembler.usage_so_far() if assembler is not None else None
        duration_s = time.monotonic() - started
        if counted is not None:
            self._partial_receipt(ticket, pool, model, counted, share, ttft_s, duration_s, end_reason, False)
            return
        relayed = assembler.content_events if assembler is not None else 0
        task = asyncio.get_running_loop().create_task(self._count_then_bill(
            ticket, pool, model, method, engine_body, relayed, share, ttft_s, duration_s, end_reason))
        self._counting.add(task)
        task.add_done_callback(self._counting.discard)

    async def _count_then_bill(self, ticket: Ticket, pool: str, model: str, method: str,
                               engine_body: Mapping[str, Any], relayed: int, share: RequestShare,
                               ttft_s: float | None, duration_s: float, end_reason: str) -> None:
        estimated = False
        try:
            async with asyncio.timeout(self._settings.engine_timeout_s):
                handle = self._llms[self._route[pool][model]]
                prompt = int(await handle.prompt_tokens.remote(dict(engine_body), method))
        except Exception as exc:
            # The engine is gone or silent: a lower bound (no token is longer than MAX_TOKEN_BYTES).
            bound = tickets.body_digest(engine_body)
            prompt, estimated = (bound[1] if bound is not None else 0), True
            log.warning("region %s: the engine of pool %s could not count the prompt of decision %s (%r); "
                        "billing a lower bound of %d tokens", self._settings.region.name, pool, ticket.decision_id,
                        exc, prompt)
        self._partial_receipt(ticket, pool, model, Usage(prompt, relayed, 0), share, ttft_s, duration_s, end_reason,
                              estimated)

    def _partial_receipt(self, ticket: Ticket, pool: str, model: str, usage: Usage, share: RequestShare,
                         ttft_s: float | None, duration_s: float, end_reason: str, tokens_estimated: bool) -> None:
        energy = energy_object(self._profiles[pool], model, usage, share)
        self._receipt(ticket, energy, usage, ttft_s, duration_s, end_reason, tokens_estimated)

    def _cache_salt(self, tenant: str) -> str:
        """vLLM's ``cache_salt`` for ``tenant``: a keyed hash (no client can name another
        tenant's salt); it changes with the region's active ticket key (one cold cache then)."""
        assert self._keys is not None
        key = self._keys.keys[self._keys.active]
        return hmac.new(key, b"cache-salt\0" + tenant.encode(), "sha256").hexdigest()[:32]

    def _precision(self, pool: str, model: str) -> str:
        """The precision the region's config serves ``model`` at on ``pool`` ("": not configured)."""
        for pool_config in self._settings.region.pools:
            if pool_config.name == pool:
                return next((m.precision for m in pool_config.models if m.name == model), "")
        return ""

    def _receipt(self, ticket: Ticket, energy: Mapping[str, Any] | None, usage: Usage | None,
                 ttft_s: float | None, duration_s: float, end_reason: str = "complete",
                 tokens_estimated: bool = False) -> dict[str, Any]:
        """The receipt of a dispatch: signed into the outbox (a router books it), and returned
        (direct mode: for the client's final event)."""
        assert self._keys is not None
        claims = signed_region_receipt.receipt_claims(
            ticket, pue=self._settings.region.pue, energy=energy,
            usage=None if usage is None else {"prompt_tokens": usage.prompt_tokens,
                                              "completion_tokens": usage.completion_tokens,
                                              "cached_tokens": usage.cached_tokens},
            at=time.time(), ttft_ms=None if ttft_s is None else ttft_s * 1000, duration_ms=duration_s * 1000,
            precision=self._precision(ticket.pool, ticket.model), end_reason=end_reason,
            tokens_estimated=tokens_estimated,
        )
        if claims["energy"] is not None and claims["energy"].get("energy_j") is not None:
            self._idle.used(ticket.pool, ticket.tenant, float(claims["energy"]["energy_j"]), ticket.carbon_g_per_kwh,
                            time.time())
        if self._store is None:
            log.error("region %s: no state store: the receipt of decision %s cannot reach the ledger",
                      self._settings.region.name, ticket.decision_id)
        else:
            self._sign(claims)
        return claims

    def _sign(self, claims: Mapping[str, Any]) -> None:
        """Into the outbox, signed, for a router to book."""
        assert self._keys is not None
        if len(self._outbox) == self._outbox.maxlen:
            log.error("region %s: receipt outbox full: dropping the oldest receipt", self._settings.region.name)
        self._outbox.append(signed_region_receipt.sign_receipt(self._keys, claims))
        self._outbox_wake.set()

    def _on_idle(self, pool: str, joules: float) -> None:
        self._metrics.idle(pool, joules)
        if self._keys is not None and self._store is not None:
            # (Kept only where a record of it can be signed and written: else nothing drains it.)
            self._idle.idle(pool, joules, time.time())

    async def _idle_writer(self) -> None:
        every_s = min(60.0, self._settings.idle_window_s / 4)
        await run_every(every_s, self._sign_closed_idle_windows, "signing idle windows", first_after_s=every_s)

    async def _sign_closed_idle_windows(self) -> None:
        """Each pool's idle energy of every billing window that ended, signed for the ledger."""
        for window in self._idle.closed(time.time()):
            self._sign(window.claims())

    async def _receipt_writer(self) -> None:
        """Append signed receipts to the store's stream in order; keep them while it is down."""
        while True:
            await self._outbox_wake.wait()
            self._outbox_wake.clear()
            while self._outbox:
                try:
                    await self._store.xadd(signed_region_receipt.STREAM, self._outbox[0], signed_region_receipt.STREAM_MAXLEN)
                except StateUnavailable as exc:
                    log.warning("region %s: %d receipts wait for the store (%s)", self._settings.region.name,
                                len(self._outbox), exc)
                    await asyncio.sleep(1.0)
                    continue
                self._outbox.popleft()

    def _start(self, pool: str, request_id: str, model: str) -> None:
        self._flight.start(pool, request_id, model)
        self._metrics.set_in_flight(pool, self._flight.count(pool))
        deployment = self._deployment_of[request_id] = self._route[pool][model]
        self._open[deployment] += 1
        self._started[deployment] += 1

    def _end(self, pool: str, request_id: str) -> RequestShare:
        # Its GPUs' intervals close now, so its last tokens are weighed in its bill.
        share = self._flight.finish(request_id, self._meter.read() if self._flight.pricing is not None else None)
        self._metrics.set_in_flight(pool, self._flight.count(pool))
        self._open[self._deployment_of.pop(request_id)] -= 1
        return share

    async def _list_models(self, request: Request) -> Response:
        created = int(time.time())
        names = sorted({name for models in self._models.values() for name in models})
        data = [{"id": name, "object": "model", "created": created, "owned_by": self._settings.region.name}
                for name in names]
        return JSONResponse({"object": "list", "data": data})

    async def _health(self, request: Request) -> Response:
        state = await self.live_state()
        healthy = state is not None and state.healthy
        return JSONResponse({"healthy": healthy}, status_code=200 if healthy else 503)

    async def _state(self, request: Request) -> Response:
        state = await self.live_state()
        return Response(codec.encode_region_state(state), media_type="application/json")

    async def _energy_view(self, request: Request) -> Response:
        return JSONResponse(self._flight.as_dict())

    async def _power_caps_view(self, request: Request) -> Response:
        if self._power_caps is None:
            return openai_error("power caps were not set at start (see the region's log)", 503, "ServiceUnavailable")
        return JSONResponse(self._power_caps.as_dict())

    # --- live state -------------------------------------------------------------------

    async def live_state(self) -> RegionLiveState:
        """What the region publishes: per pool, its load, the models it serves with their
        context limits, GPU power, and its warm and starting replicas, summed over its
        deployments and per model (``scheduler.region.warmth``).

        A deployment's engine is asked (``live_stats``) only when it has warm replicas and has
        had requests since it last answered, or has not answered since its replicas came up: an
        idle deployment is published on its last answer (no load: nothing ran since), so that no
        call of ours keeps its replicas busy in the eyes of Serve's autoscaler. A deployment with
        no warm replica is published cold: its models with no warm replica (their requests wait
        in the pool's ``queue_depth``). A deployment whose engine is slow to answer is published
        on its last answer for ``engine_grace_s``; one whose engine failed its call, was silent
        longer, or never answered is left out with its models, and the router then treats them
        as not served (``EngineAnswers``); a pool none of whose deployments is published is left
        out. Without Serve's counts (no Serve: tests) every deployment is asked every time. The
        region is healthy while a pool is published."""
        settings = self._settings
        replicas = await self._replica_counts()
        asked = [key for key in self._llms if self._needs_asking(key, replicas)]
        answers = await asyncio.gather(
            *(asyncio.wait_for(self._llms[key].live_stats.remote(), timeout=settings.engine_timeout_s)
              for key in asked),
            return_exceptions=True,
        )
        answered = dict(zip(asked, answers, strict=True))
        pools: dict[str, PoolLiveState] = {}
        generated_total = 0.0
        now = time.monotonic()
        for name, route in self._route.items():
            published = [served for key in dict.fromkeys(route.values())
                         if (served := self._deployment_view(key, replicas, answered.get(key), now)) is not None]
            if not published:
                continue
            generated_total += sum(float(d.stats.get("generation_tokens_total", 0.0))
                                   for d in published if d.stats is not None)
            pools[name] = self._pool_state(name, published)
        if pools and self._meter.available:
            j_per_token = self._j_per_token(generated_total)
            pools = {name: replace(state, measured_j_per_token=j_per_token) for name, state in pools.items()}
        return RegionLiveState(region=settings.region.name, healthy=bool(pools), observed_at=time.time(), pools=pools)

    def _deployment_view(self, key: Deployment, replicas: Mapping[Deployment, DeploymentReplicas] | None,
                         answer: Mapping[str, Any] | BaseException | None, now: float) -> PublishedDeployment | None:
        """What is published of one deployment (None: nothing, it is not served)."""
        if replicas is not None and key not in replicas:
            return None  # Serve runs no deployment for it (deleted, or not deployed): not served
        counts = None if replicas is None else replicas[key]
        if counts is not None and counts.warm == 0:
            self._engine_answers.forget(key)
            return PublishedDeployment(key, counts, None, fresh=False)
        if answer is None:  # not asked: idle since its last answer
            stats = self._engine_answers.last(key)
            assert stats is not None  # _needs_asking asks a deployment that has none
            return PublishedDeployment(key, counts, stats, fresh=True)
        stats = self._engine_answers.standing(key, answer, now)
        if stats is None:
            log.warning("region %s: engine of %s not answering (%r): not publishing it",
                        self._settings.region.name, self._deployments[key], answer)
            return None
        fresh = not isinstance(answer, BaseException)
        if fresh:
            self._asked_at_started[key] = self._started[key]
        return PublishedDeployment(key, counts, stats, fresh)

    def _needs_asking(self, key: Deployment, replicas: Mapping[Deployment, DeploymentReplicas] | None) -> bool:
        """Whether the deployment's engine is asked for its figures now (``live_state``)."""
        if replicas is None:
            return True
        if key not in replicas or replicas[key].warm == 0:
            return False  # a call would wake it
        return (self._engine_answers.last(key) is None or self._open[key] > 0
                or self._started[key] != self._asked_at_started.get(key))

    async def _replica_counts(self) -> dict[Deployment, DeploymentReplicas] | None:
        """Deployment -> its warm and starting replicas, from Serve's controller; None outside
        a Serve replica, or when the controller does not answer in time."""
        if not ray.is_initialized():
            return None
        try:
            app = serve.get_replica_context().app_name
            status = await asyncio.wait_for(asyncio.to_thread(serve.status), self._settings.engine_timeout_s)
        except Exception as exc:  # the counts are a refinement: without them every deployment is asked
            log.warning("region %s: Serve's replica counts unavailable (%r)", self._settings.region.name, exc)
            return None
        return deployment_replicas(status, app, self._deployments)

    def _pool_state(self, name: str, published: list[PublishedDeployment]) -> PoolLiveState:
        """The pool's published state from its published deployments: their engines' answers
        (``fresh``: this call's, or the last one of an idle deployment; else the last one
        standing; None: at zero), the gateway's own counts and Serve's replica counts (None: not
        known). A pool none of whose deployments has a warm replica is cold: its requests wait."""
        models: dict[str, int] = {}
        for served in published:
            engine_len = None if served.stats is None else served.stats.get("max_model_len")
            for model, limit in self._served[served.key].items():
                if isinstance(engine_len, int | float) and engine_len > 0:
                    limit = min(limit, int(engine_len))
                models[model] = limit
        counted = [served.counts for served in published if served.counts is not None]
        warm = None if not counted else sum(c.warm for c in counted)
        starting = None if not counted else sum(c.starting for c in counted)
        model_replicas = None if not counted else {
            model: ModelReplicas(served.counts.warm, served.counts.starting)
            for served in published if served.counts is not None for model in self._served[served.key]}
        answering = [served for served in published if served.stats is not None]
        in_flight = self._flight.count(name)
        if not answering:
            return PoolLiveState(queue_depth=in_flight, running=0, gpu_power_w=self._power_w, models=models,
                                 replicas=0, starting_replicas=starting, model_replicas=model_replicas)
        answers = [served.stats for served in answering if served.stats is not None]
        # The running count each replica of the pool reported in its streams; before any did,
        # the engines' answers.
        reported = self._flight.running(name)
        running = min(sum(int(a.get("running", 0)) for a in answers) if reported is None else reported, in_flight)
        # The rates move only with fresh answers: a standing one's prompt-token total would
        # count as no prompt tokens arriving; the next answer's window spans the gap.
        prompt_totals = [float(a["prompt_tokens_total"]) for a in answers if a.get("prompt_tokens_total") is not None]
        arrival_rate, prompt_rate = (
            self._arrival_rates(name, sum(prompt_totals) if prompt_totals else None)
            if all(served.fresh for served in answering) else self._rates.get(name, (0.0, 0.0)))
        # The engines' cache figures, weighed by their warm replicas (1 each where not counted).
        weights = [float(served.counts.warm) if served.counts is not None else 1.0 for served in answering]
        return PoolLiveState(
            queue_depth=in_flight - running,
            running=running,
            kv_cache_usage=_weighed(answers, weights, "kv_cache_usage"),
            prefix_cache_hit_rate=_weighed(answers, weights, "prefix_cache_hit_rate"),
            gpu_power_w=self._power_w,
            arrival_rate=arrival_rate,
            prompt_tokens_rate=prompt_rate,
            models=models,
            replicas=warm,
            starting_replicas=starting,
            model_replicas=model_replicas,
        )

    def _arrival_rates(self, pool: str, prompt_total: float | None) -> tuple[float, float]:
        """Requests started and prompt tokens the engine prefilled per second, averaged
        exponentially over ``RATE_WINDOW_S`` (one publication interval alone is too noisy)."""
        now, started = time.monotonic(), self._flight.started_total(pool)
        previous = self._last_arrivals.get(pool)
        self._last_arrivals[pool] = (now, started, prompt_total or 0.0)
        rates = self._rates.get(pool, (0.0, 0.0))
        if previous is None or now <= previous[0]:
            return rates
        window = now - previous[0]
        prompt_rate = max(0.0, (prompt_total or 0.0) - previous[2]) / window if prompt_total is not None else 0.0
        weight = 1.0 - math.exp(-window / RATE_WINDOW_S)
        arrivals, prompts = rates
        self._rates[pool] = (arrivals + weight * ((started - previous[1]) / window - arrivals),
                             prompts + weight * (prompt_rate - prompts))
        return self._rates[pool]

    def _j_per_token(self, generated_total: float | None) -> float | None:
        """Measured J per generated token since the previous publication (None unmeasured)."""
        if not self._meter.available or generated_total is None:
            return None
        previous, self._last_rate = self._last_rate, (self._flight.attributed_j, generated_total)
        if previous is None or generated_total <= previous[1]:
            return None
        return (self._flight.attributed_j - previous[0]) / (generated_total - previous[1])

    async def _meter_loop(self) -> None:
        await run_every(self._settings.meter_interval_s, self._read_meter, "reading the energy meter")

    async def _read_meter(self) -> None:
        reading = self._meter.read()
        if reading is not None:  # a failed read: the next one's counters hold its energy
            self._power_w = reading.total_power_w
            self._flight.meter(reading)

    def _open_streams(self) -> int:
        return sum(self._flight.count(pool) for pool in self._settings.pools)

    async def _flush_receipts(self) -> None:
        """At shutdown, within ``RECEIPT_FLUSH_S``: the streams the server cut end (each one's
        relay bills it as it ends: a cancelled task's finally, or a closed generator's once it is
        collected), their prompt counts come, and every receipt reaches the store before the
        writer stops."""
        try:
            async with asyncio.timeout(RECEIPT_FLUSH_S):
                while self._open_streams() or self._counting:
                    self._outbox_wake.set()
                    await asyncio.sleep(0.05)
                if self._keys is not None:
                    # The windows still open, their idle joules and uses until now.
                    for window in self._idle.drain():
                        self._sign(window.claims())
                while self._outbox:
                    self._outbox_wake.set()
                    await asyncio.sleep(0.05)
        except TimeoutError:
            open_streams = self._open_streams()
            log.error("region %s: at shutdown, %d streams still open and %d receipts not written (the store is "
                      "unreachable?)", self._settings.region.name, open_streams,
                      len(self._outbox) + len(self._counting))

    async def __del__(self) -> None:
        if self._store is not None:
            await self._flush_receipts()
        for task in self._tasks:
            await stop_task(task)
        if self._store is not None:
            await self._store.close()
        self._meter.close()
        if self._capper is not None:
            for device in self._capper.restore():
                log.info("region %s: power limit restored: %s", self._settings.region.name, device.describe(False))
            self._capper.close()
