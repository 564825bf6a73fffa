"""``LocalStack``: Ray in-process, a subset of the regions as Serve applications, the router.

What ``scheduler up`` runs, and what the Ray integration tests start. Locally every region
runs one small CPU replica per pool its ``local`` profile lists; the router decides over the
regions that are deployed, with their endpoints pointed at the Serve HTTP proxy
(``http://127.0.0.1:<port>/<region>``), and offers only the pools the regions report live
(the others are rejected as "not served"). Dispatch tickets are on: the stack makes fresh
keys for each run and gives each gateway its region's keys.

State: the Redis at 127.0.0.1:6379 when it answers (a namespace of our own; the regions'
gateways publish their live state there themselves), else the in-memory store (the stack
then bridges each gateway's ``GET /state`` into it from this process).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.schema import RegionConfig
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region import DEFAULT_LOCAL_REGIONS
from scheduler.region.app import EngineOptions, build_region_app, local_pools
from scheduler.server.auth import KeyRing
from scheduler.state.redis_store import delete_namespace
from scheduler.tickets import TicketKeyRing

log = logging.getLogger(__name__)

# One region per continent: each costs ~3 GB on this CPU build, so not all eight.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
RAY_OBJECT_STORE_BYTES = 256 * 2**20
# ray.shutdown() returns before its workers are gone; one stuck in an engine's shutdown can
# outlive it by minutes. Processes Ray started get this long to exit, then SIGTERM, SIGKILL.
RAY_EXIT_GRACE_S = 20.0


def live_children() -> set[int]:
    """This process's descendants that are not zombies."""
    import psutil

    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return alive


def _reap(pids: set[int], grace_s: float) -> None:
    """Wait ``grace_s`` for ``pids`` (processes this stack started) to exit, then end them."""
    import psutil

    processes = []
    for pid in pids:
        try:
            processes.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for signal_name, send in (("SIGTERM", psutil.Process.terminate), ("SIGKILL", psutil.Process.kill)):
        if not alive:
            return
        for process in alive:
            try:
                log.warning("Ray left pid %d (%s) running; sending %s", process.pid,
                            " ".join(process.cmdline()[:3]), signal_name)
                send(process)
            except psutil.NoSuchProcess:
                continue
        _, alive = psutil.wait_procs(alive, timeout=5.0)


def free_port(preferred: int | None = None) -> int:
    """``preferred`` if it is free on 127.0.0.1, else any free port."""
    for port in ([preferred] if preferred else []) + [0]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            chosen: int = probe.getsockname()[1]
            return chosen
    raise OSError("no free port on 127.0.0.1")


def local_view(region: RegionConfig, endpoint: str) -> RegionConfig:
    """The region as the local stack runs it: at ``endpoint``."""
    return region.model_copy(update={"endpoint": endpoint})


async def redis_answers(url: str, timeout_s: float = 0.5) -> bool:
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        return bool(await client.ping())
    except (OSError, aioredis.RedisError):
        return False
    finally:
        await client.aclose()


@dataclass(frozen=True)
class StackOptions:
    regions_dir: Path | None = None
    policies_dir: Path | None = None
    policy: str = "default"
    only: tuple[str, ...] = DEFAULT_LOCAL_REGIONS
    # None: Redis at DEFAULT_REDIS_URL if it answers, else "memory".
    state_url: str | None = None
    # None: a fresh "up-<random>" namespace.
    namespace: str | None = None
    # Delete the namespace's keys from Redis at stop.
    clean_namespace: bool = True
    router_address: str = "127.0.0.1:0"
    # The router's HTTP front door (the OpenAI API, Route for direct mode); None: not served.
    router_http_port: int | None = 0
    # Serve's HTTP proxy: 8000 when free, else any free port.
    http_port: int = 8000
    dashboard: bool = True
    publish_interval_s: float = 1.0
    # How often the router rebuilds its snapshot.
    refresh_interval_s: float = 0.5
    carbon: bool = True
    # "gpu": each region's replica on one NVIDIA GPU (the CUDA build of vLLM, `.[gpu]`).
    device: Literal["cpu", "gpu"] = "cpu"
    # False: regions accept requests without a dispatch ticket (development only; warned).
    tickets: bool = True
    # The regions' ticket keys (None: fresh keys for this run, in memory only).
    ticket_keys: TicketKeyRing | None = None
    # The router's tenant API keys (None: no authentication; `scheduler up` makes a key per run).
    api_keys: KeyRing | None = None


@dataclass
class LocalStack:
    options: StackOptions = field(default_factory=StackOptions)
    say: Callable[[str], None] = log.info
    regions: tuple[RegionConfig, ...] = field(default=(), init=False)
    state_url: str = field(default="memory", init=False)
    namespace: str = field(default="", init=False)
    http_base: str = field(default="", init=False)
    dashboard_url: str | None = field(default=None, init=False)
    router: Any = field(default=None, init=False)
    ticket_keys: TicketKeyRing | None = field(default=None, init=False)
    _ray_started: bool = field(default=False, init=False)
    # Our descendants before ray.init: anything new at stop is Ray's to clean up.
    _before_ray: set[int] = field(default_factory=set, init=False)

    @property
    def router_target(self) -> str:
        return f"127.0.0.1:{self.router.port}"

    @property
    def router_http(self) -> str | None:
        """The router's HTTP front door (None: not served)."""
        port = self.router.http_port
        return None if port is None else f"http://127.0.0.1:{port}"

    def endpoint(self, region: str) -> str:
        return f"{self.http_base}/{region}"

    async def start(self) -> None:
        options = self.options
        fleet = load_checked_fleet(options.regions_dir, options.policies_dir)
        policy = fleet.policy(options.policy)
        by_name = {r.name: r for r in fleet.regions}
        unknown = [name for name in options.only if name not in by_name]
        if unknown:
            raise ValueError(f"unknown region(s) {unknown} (known: {', '.join(sorted(by_name))})")
        self.namespace = options.namespace or f"up-{uuid.uuid4().hex[:8]}"
        self.state_url = await self._choose_state(options.state_url)
        # On this thread: Ray installs its signal handlers only from the main thread.
        self._start_ray(sum(len(deployments) for name in options.only for deployments in local_pools(by_name[name]).values()))
        self.regions = tuple(local_view(by_name[name], self.endpoint(name)) for name in options.only)
        self.ticket_keys = None
        if options.tickets:
            self.ticket_keys = options.ticket_keys or TicketKeyRing.generate(options.only)
            for name in options.only:
                self.ticket_keys.of(name)  # a given key file must cover every region deployed
        self.say(f"deploying {len(self.regions)} region(s): {', '.join(options.only)} (a few minutes on 2 cores)"
                 + ("" if options.tickets else "; WARNING: dispatch tickets are OFF (development only)"))
        await asyncio.to_thread(self._deploy_regions)
        self.router = await self._start_router(policy)
        await self.wait_until_live()

    async def wait_until_live(self, timeout_s: float = 30.0) -> None:
        """Until the router's snapshot holds a fresh state of every region listing every pool
        the stack deployed there. A gateway lists a pool once its engine has answered, so the
        first states after Serve reports the engines running may list only some pools (or
        none: unhealthy), and the router offers only the pools listed ("not served")."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        deployed = {r.name: set(local_pools(r)) for r in self.regions}
        waiting = list(deployed)
        while waiting:
            snapshot = self.router.deps.refresher.current()
            waiting = [name for name in waiting
                       if (state := snapshot.fresh_live(name)) is None or not deployed[name] <= state.pools.keys()]
            if waiting and loop.time() > deadline:
                self.say(f"warning: not every pool is live yet in {', '.join(waiting)}")
                return
            await asyncio.sleep(0.2)

    async def _choose_state(self, wanted: str | None) -> str:
        if wanted is not None:
            return wanted
        if await redis_answers(DEFAULT_REDIS_URL):
            self.say(f"state: Redis at {DEFAULT_REDIS_URL} (namespace {self.namespace})")
            return DEFAULT_REDIS_URL
        self.say("state: Redis at 127.0.0.1:6379 does not answer; using the in-memory store")
        return "memory"

    def _start_ray(self, engines: int) -> None:
        import ray
        from ray import serve

        self._before_ray = live_children()

        # Local only: the dashboard's REST API without tokens (Ray 2.60 turns auth on).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        # Serve kills an HTTP proxy not ready in 5 s, and serve.start() then fails: a busy
        # 2-core machine takes longer to import it. Workers inherit this from the driver.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        context = ray.init(
            # Logical CPUs: one placement bundle per engine plus the ingresses (num_cpus=0).
            num_cpus=max(os.cpu_count() or 2, engines + 1),
            include_dashboard=self.options.dashboard,
            dashboard_host="127.0.0.1",
            dashboard_port=free_port(8265),
            object_store_memory=RAY_OBJECT_STORE_BYTES,
            namespace="scheduler",
            log_to_driver=False,
            configure_logging=False,
        )
        self._ray_started = True
        dashboard = getattr(context, "dashboard_url", None)
        self.dashboard_url = f"http://{dashboard}" if dashboard else None
        port = free_port(self.options.http_port)
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        # Serve logs every deployment's options at INFO; follow the CLI's verbosity instead.
        logging.getLogger("ray.serve").setLevel(logging.getLogger().getEffectiveLevel())
        self.http_base = f"http://127.0.0.1:{port}"

    def _deploy_regions(self) -> None:
        from ray import serve

        cores = os.cpu_count() or 1
        store_url = None if self.state_url == "memory" else self.state_url
        keys = self.ticket_keys
        targets = []
        engines = 0
        for region in self.regions:
            pools = local_pools(region, EngineOptions(device=self.options.device))
            if self.options.device == "cpu":
                # Spread the engines' OpenMP threads over the cores.
                core = itertools.count(engines)
                pools = {name: tuple(replace(o, omp_core=next(core) % cores) for o in deployments)
                         for name, deployments in pools.items()}
            engines += sum(len(deployments) for deployments in pools.values())
            app = build_region_app(
                region, pools, store_url=store_url, namespace=self.namespace,
                publish_interval_s=self.options.publish_interval_s,
                tickets="required" if keys is not None else "disabled",
                ticket_keys=keys.of(region.name) if keys is not None else None,
            )
            targets.append(serve.RunTarget(app, name=region.name, route_prefix=f"/{region.name}"))
        serve.run_many(targets)

    async def _start_router(self, policy: Any) -> Any:
        from scheduler.datalayer.snapshot import SnapshotBuilder
        from scheduler.region.publisher import StateBridge
        from scheduler.server.app import build_deps, start_router, with_services
        from scheduler.state.factory import open_store

        store = open_store(self.state_url, self.namespace)
        backend = "memory" if self.state_url == "memory" else "redis"
        deps = build_deps(SnapshotBuilder(compile_fleet(self.regions), compile_policy(policy)), store, backend,
                          refresh_interval_s=self.options.refresh_interval_s, ticket_keys=self.ticket_keys,
                          keys=self.options.api_keys)
        if self.state_url == "memory":
            endpoints = {r.name: self.endpoint(r.name) for r in self.regions}
            deps.background.append(StateBridge(endpoints, store, interval_s=self.options.publish_interval_s))
        deps.http_port = self.options.router_http_port
        # As a production router runs: carbon pollers (CSV replay by default) and the ledger.
        with_services(deps, carbon_pollers=self.options.carbon)
        return await start_router(self.options.router_address, deps)

    async def delete_region(self, name: str) -> None:
        """Take a region's application down (its gateway stops publishing)."""
        from ray import serve

        await asyncio.to_thread(serve.delete, name)

    async def stop(self) -> None:
        if self.router is not None:
            await self.router.stop(grace_s=2.0)
            self.router = None
        if self._ray_started:
            await asyncio.to_thread(self._stop_ray)
        if self.state_url != "memory" and self.options.clean_namespace and self.namespace:
            removed = await delete_namespace(self.state_url, self.namespace)
            log.info("removed %d keys of namespace %s", removed, self.namespace)

    def _stop_ray(self) -> None:
        import ray
        from ray import serve

        try:
            serve.shutdown()  # type: ignore[no-untyped-call]
        finally:
            ray.shutdown()
            self._ray_started = False
            _reap(live_children() - self._before_ray, grace_s=RAY_EXIT_GRACE_S)
