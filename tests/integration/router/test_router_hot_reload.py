"""Hot reload with traffic flowing: two ``scheduler router`` processes on one Redis, real stub
regions, Generate streams running without pause in the background.

1. A broken policy file lands on router A (a file change, then SIGHUP, then the admin RPC):
   no request fails, both routers keep the version in use, and the error names the file and
   the field (and the value) in the RPC's answer, in A's log and on A's /metrics.
2. A good policy file lands on A: A applies and publishes it, routing changes (price -> carbon:
   eu-north -> eu-central), and router B, whose own files never changed, converges to the new
   version within 5 s (the time is printed). Every decision and receipt carries the version it
   was decided on, and so does every audit entry.
3. With Redis killed, a router goes on serving on its config, applies a reload at once (as
   ``local-<hash>``) and publishes it when Redis is back; no request fails meanwhile.

The routers run as in production: they trust one operator key (``--config-trust``) and publish
their files with the operator's signature of them (``--config-signature``), which the test
writes before each good file.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml

from scheduler import exit_codes
from scheduler.client import AsyncSchedulerClient, RetryPolicy, SchedulerRpcError
from scheduler.server.auth import create_key
from scheduler.server.config_reload.sources import ConfigBundle, ConfigSources, read_bundle
from scheduler.server.config_signing import SigningKey, trust_entry
from scheduler.state import codec, keys
from scheduler.state.redis_store import RedisStore
from scheduler.tickets import TicketKeyRing
from scheduler.types import Signal

from .conftest import Fleet, RouterFactory

pytestmark = pytest.mark.integration

REDIS_URL = os.environ.get("SCHEDULER_TEST_REDIS_ROUTER", "redis://127.0.0.1:6379/1")
LISTENING = re.compile(r"router listening on [^:]+:(\d+)")
METRICS = re.compile(r"metrics on (http://\S+/metrics)")
MODEL = "llama-3.1-8b"

POLICY = """\
name: hot
description: hot reload test policy ({objective})
scorers:
  - {scorer}
max_age: {{carbon: 2h, region_state: {region_state}, price: 1d}}
fallback:
  scorers:
    - {{type: price-scorer, rate: 1}}
# The stub regions publish no live state: trust them.
unknown_region_state: {{stale: assume-healthy, missing: assume-healthy, missing_warmup: 30s}}
slo:
  interactive: {{ttft_ms: 60000, ttft_ms_per_1k_prompt_tokens: 100, tpot_ms: 1000}}
  batch: {{ttft_ms: 60000, ttft_ms_per_1k_prompt_tokens: 300, tpot_ms: 1000}}
  deferrable: {{ttft_ms: 3600000, ttft_ms_per_1k_prompt_tokens: 0, tpot_ms: 2000}}
"""
BY_PRICE = POLICY.format(objective="price", scorer="{type: price-scorer, rate: 1}", region_state="5s")
BY_CARBON = POLICY.format(objective="carbon", scorer="{type: carbon-scorer, rate: 3000 USD/tCO2e}",
                          region_state="5s")
BROKEN = POLICY.format(objective="carbon, broken", scorer="{type: carbon-scorer, rate: 3000 USD/tCO2e}",
                       region_state="soon")
OPERATOR = SigningKey.generate("ops-1")
# Grid intensities (gCO2e/kWh) that make eu-central the cleanest of the three by far.
INTENSITY = {"eu-north": 600.0, "eu-central": 10.0, "us-east": 700.0}


def write_atomically(path: Path, text: str) -> None:
    """As a ConfigMap update does: the new file replaces the old one in one rename."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


@dataclass
class RouterProcess:
    name: str
    process: subprocess.Popen[str]
    port: int
    metrics_url: str
    log: Path
    policies: Path
    sources: ConfigSources

    def metrics(self) -> str:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
            text: str = answer.read().decode()
            return text

    def sign_policy(self, text: str) -> None:
        sign_policy(self.sources, text)


def sign_policy(sources: ConfigSources, text: str) -> None:
    """The operator signs the files as they will be once hot.yaml holds ``text`` (written before
    the file, as a pipeline that ships both might)."""
    now = read_bundle(sources)
    bundle = ConfigBundle(now.regions, {**now.policies, "hot.yaml": text}, now.keys, now.budgets)
    assert sources.signature is not None
    write_atomically(sources.signature, OPERATOR.sign(bundle.digest, time.time()).to_text())


def start_router(name: str, root: Path, stub_fleet: Fleet, keys_file: Path, ticket_keys: Path,
                 namespace: str, redis_url: str = REDIS_URL) -> RouterProcess:
    regions, policies = root / "regions", root / "policies"
    regions.mkdir(parents=True)
    policies.mkdir()
    for config in stub_fleet.configs:
        (regions / f"{config.name}.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    (policies / "hot.yaml").write_text(BY_PRICE)
    trust = root / "trust.yaml"
    trust.write_text(trust_entry(OPERATOR))
    sources = ConfigSources(regions, policies, "hot", keys_file, None, root / "config.sig")
    sign_policy(sources, BY_PRICE)
    log = root / "router.log"
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "router", "--host", "127.0.0.1", "--port", "0",
         "--regions", str(regions), "--policies", str(policies), "--policy", "hot",
         "--namespace", namespace, "--keys", str(keys_file), "--ticket-keys", str(ticket_keys),
         "--config-trust", str(trust), "--config-signature", str(sources.signature),
         "--refresh-interval", "0.5", "--keys-reload-interval", "0.5", "--config-sync-interval", "1",
         "--rate-limit", "100000", "--metrics-port", "0", "--grace", "1", "--no-carbon-pollers"],
        stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env={**os.environ, "SCHEDULER_STATE": redis_url},
    )
    assert process.stdout is not None
    listening = process.stdout.readline()
    metrics = process.stdout.readline()
    port, url = LISTENING.search(listening), METRICS.search(metrics)
    if not port or not url:
        process.kill()
        raise AssertionError(f"router {name} did not start: {listening!r} {metrics!r}\n{log.read_text()}")
    return RouterProcess(name, process, int(port.group(1)), url.group(1), log, policies, sources)


@dataclass
class Admin:
    key: str
    tenant_key: str


@pytest.fixture
async def namespace() -> AsyncIterator[str]:
    name = f"test-hot-reload-{uuid.uuid4().hex[:12]}"
    yield name
    raw = aioredis.Redis.from_url(REDIS_URL)
    found = [key async for key in raw.scan_iter(match=f"sched:{name}:*")]
    if found:
        await raw.delete(*found)
    await raw.aclose()


def credentials(tmp_path: Path, stub_fleet: Fleet) -> tuple[Path, Path, Admin]:
    admin, tenant = create_key("ops", admin=True), create_key("acme")
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(yaml.safe_dump({"keys": [admin.entry_dict(), tenant.entry_dict()]}))
    ticket_keys = tmp_path / "ticket-keys.yaml"
    ticket_keys.write_text(TicketKeyRing.generate(c.name for c in stub_fleet.configs).to_yaml())
    return keys_file, ticket_keys, Admin(admin.key, tenant.key)


def stop_routers(started: list[RouterProcess]) -> None:
    for router in started:
        router.process.terminate()
    for router in started:
        try:
            assert router.process.wait(timeout=30) == 0
        except subprocess.TimeoutExpired:
            router.process.kill()
            raise


@pytest.fixture
def routers(stub_fleet: Fleet, tmp_path: Path, namespace: str) -> Iterator[tuple[RouterProcess, RouterProcess, Admin]]:
    keys_file, ticket_keys, admin = credentials(tmp_path, stub_fleet)
    started: list[RouterProcess] = []
    try:
        for name in ("a", "b"):
            started.append(start_router(name, tmp_path / name, stub_fleet, keys_file, ticket_keys, namespace))
        yield started[0], started[1], admin
    finally:
        stop_routers(started)


@dataclass
class Traffic:
    """Generate streams without pause against the routers, each outcome recorded."""

    clients: list[tuple[str, AsyncSchedulerClient]]
    # (monotonic time at the end, router, decision's region, decision's version, receipt's version)
    done: list[tuple[float, str, str, str, str]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self, streams_per_client: int) -> None:
        for name, client in self.clients:
            for _ in range(streams_per_client):
                self._tasks.append(asyncio.create_task(self._run(name, client)))

    async def _run(self, name: str, client: AsyncSchedulerClient) -> None:
        while not self._stop.is_set():
            generation = client.generate("hello there", model=MODEL, max_tokens=8, timeout_s=20)
            try:
                text = await generation.text()
            except SchedulerRpcError as exc:
                self.failures.append(f"{name}: {exc}")
                continue
            decision, receipt = generation.decision, generation.receipt
            if not text or decision is None or receipt is None:
                self.failures.append(f"{name}: text {text!r}, decision {decision is not None}, "
                                     f"receipt {receipt is not None}")
                continue
            self.done.append((time.monotonic(), name, decision.ranked[0].region, decision.config_version,
                              receipt.config_version))

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    def since(self, at: float, router: str) -> list[tuple[float, str, str, str, str]]:
        return [d for d in self.done if d[0] >= at and d[1] == router]


async def write_signals(store: RedisStore, stub_fleet: Fleet) -> None:
    now = time.time()
    for config in stub_fleet.configs:
        signal_ = Signal("carbon_intensity", config.carbon.zone, INTENSITY[config.name], "gCO2eq/kWh", now - 30, now,
                         "test")
        await store.set(keys.signal("carbon_intensity", config.carbon.zone), codec.encode_signal(signal_))


async def routable(*clients: AsyncSchedulerClient) -> None:
    """Wait until every router routes: their first probes of the stub regions (which answer on
    this test's event loop) may have run while the fixtures starting the routers blocked it."""
    async def every_router_routes() -> bool:
        try:
            for client in clients:
                await client.route("hi", model=MODEL, max_tokens=8)
        except SchedulerRpcError:
            return False
        return True

    await wait_for(every_router_routes, 10, "the routers route")


async def wait_for(predicate: object, timeout_s: float, what: str) -> float:
    """Poll ``predicate`` (an async callable) every 20 ms; the seconds it took."""
    started = time.monotonic()
    while not await predicate():  # type: ignore[operator]
        assert time.monotonic() - started < timeout_s, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.02)
    return time.monotonic() - started


@pytest.mark.timeout(180)
async def test_hot_reload_under_traffic_broken_then_good_and_a_second_router_converges(
    stub_fleet: Fleet, routers: tuple[RouterProcess, RouterProcess, Admin], namespace: str,
) -> None:
    router_a, router_b, admin = routers
    store = RedisStore.from_url(REDIS_URL, namespace)
    await write_signals(store, stub_fleet)
    no_retry = RetryPolicy(attempts=1)
    admin_a = AsyncSchedulerClient(f"127.0.0.1:{router_a.port}", api_key=admin.key, retry=no_retry)
    admin_b = AsyncSchedulerClient(f"127.0.0.1:{router_b.port}", api_key=admin.key, retry=no_retry)
    tenant_a = AsyncSchedulerClient(f"127.0.0.1:{router_a.port}", api_key=admin.tenant_key, retry=no_retry)
    tenant_b = AsyncSchedulerClient(f"127.0.0.1:{router_b.port}", api_key=admin.tenant_key, retry=no_retry)
    traffic = Traffic([("a", tenant_a), ("b", tenant_b)])
    try:
        await routable(admin_a, admin_b)
        # Both routers joined the store on one version: A published its files, B has the same ones.
        first = (await admin_a.route("hi", model=MODEL, max_tokens=8)).config_version
        assert re.fullmatch(r"1-[0-9a-f]{12}", first), first
        assert (await admin_b.route("hi", model=MODEL, max_tokens=8)).config_version == first

        traffic.start(streams_per_client=4)
        await asyncio.sleep(1.0)
        assert traffic.done and not traffic.failures, traffic.failures[:3]
        assert {d[2] for d in traffic.done} == {"eu-north"}  # by price

        # --- 1. a broken policy file, while traffic flows -------------------------------
        broken_at = time.monotonic()
        hot_a = router_a.policies / "hot.yaml"
        write_atomically(hot_a, BROKEN)

        async def logged() -> bool:
            return "max_age.region_state" in router_a.log.read_text()

        await wait_for(logged, 10, "router A logged the broken file")  # the file watcher's reload
        router_a.process.send_signal(signal.SIGHUP)
        answer = await admin_a.reload_config()
        assert not answer.ok and not answer.changed
        assert answer.version == answer.previous_version == first
        assert [(p.file, p.field) for p in answer.problems] == [(str(hot_a), "max_age.region_state")]
        assert "'soon'" in answer.problems[0].message
        print(f"\nbroken reload refused: {answer.problems[0].file}: {answer.problems[0].field}: "
              f"{answer.problems[0].message}; version {answer.version} kept")
        # The command line says the same, and exits with the config error's code.
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scheduler.cli", "config", "reload", "--router", f"127.0.0.1:{router_a.port}",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "SCHEDULER_API_KEY": admin.key})
        out, err = await cli.communicate()
        assert cli.returncode == exit_codes.CONFIG, (out, err)
        assert f"{hot_a}: max_age.region_state: " in err.decode() and f"keeps version {first}" in err.decode()
        log_lines = [line for line in router_a.log.read_text().splitlines() if "config not reloaded" in line]
        assert any(f"{hot_a}: max_age.region_state:" in line and "'soon'" in line for line in log_lines), log_lines

        async def sighup_counted() -> bool:
            return 'scheduler_config_reloads_total{result="rejected",trigger="SIGHUP"} 1' in router_a.metrics()

        await wait_for(sighup_counted, 10, "SIGHUP's reload")
        metrics = router_a.metrics()
        assert f'scheduler_config_problem{{field="max_age.region_state",file="{hot_a}"' in metrics
        assert 'scheduler_config_reloads_total{result="rejected",trigger="file-change"} 1' in metrics
        assert "scheduler_config_last_reload_ok 0" in metrics
        await asyncio.sleep(1.5)  # traffic goes on (and router B, one sync later, has nothing new)
        during = traffic.since(broken_at, "a") + traffic.since(broken_at, "b")
        assert during and {(d[3], d[4]) for d in during} == {(first, first)}
        assert not traffic.failures, traffic.failures[:3]

        # --- 2. a good policy file: routing changes, router B converges ----------------
        written_at = time.monotonic()
        router_a.sign_policy(BY_CARBON)
        write_atomically(hot_a, BY_CARBON)

        async def version_of(client: AsyncSchedulerClient) -> str:
            return (await client.route("hi", model=MODEL, max_tokens=8)).config_version

        async def a_changed() -> bool:
            return await version_of(admin_a) != first

        a_took = await wait_for(a_changed, 10, "router A applied the good file")
        second = await version_of(admin_a)
        assert re.fullmatch(r"2-[0-9a-f]{12}", second), second

        async def b_converged() -> bool:
            return await version_of(admin_b) == second

        b_took = await wait_for(b_converged, 5, "router B converged")
        converged_s = time.monotonic() - written_at
        print(f"router A applied version {second} {a_took:.2f} s after the file was written; router B "
              f"converged {b_took:.2f} s after that, {converged_s:.2f} s after the write")
        assert converged_s < 5.0
        await asyncio.sleep(1.0)
        await traffic.stop()

        assert not traffic.failures, traffic.failures[:3]
        print(f"{len(traffic.done)} streams, 0 failed")
        # Routing changed: by carbon, eu-central; each request records the version it used.
        after = [d for d in traffic.done if d[3] == second]
        assert after and {d[2] for d in after} == {"eu-central"}
        assert {d[2] for d in traffic.done if d[3] == first} == {"eu-north"}
        assert {d[3] for d in traffic.done} == {first, second}
        assert all(d[3] == d[4] for d in traffic.done)  # each receipt: its decision's version
        assert {d[1] for d in after} == {"a", "b"}

        # Router B's own files never changed: it adopted the version from the store. They were
        # signed before that version: going back to them (a reload of B's files) takes a fresh
        # signature, or every router would take it for a replay.
        cli = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "scheduler.cli", "config", "reload", "--router", f"127.0.0.1:{router_b.port}",
            "--api-key", admin.key, "--dry-run", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await cli.communicate()
        assert cli.returncode == exit_codes.CONFIG and f"keeps version {second}" in err.decode(), (out, err)
        assert "signed_at: signed at" in err.decode() and "sign these files again" in err.decode()
        dry = await admin_b.reload_config(dry_run=True)
        assert not dry.ok and dry.version == second and dry.source.startswith("store (published by ")
        assert "scheduler_config_last_reload_ok 1" in router_a.metrics()
        entries = await store.xrange(keys.AUDIT, 100_000)
        assert entries and {e[1]["config_version"] for e in entries} <= {first, second}
        assert second in {e[1]["config_version"] for e in entries}
    finally:
        await traffic.stop()
        for client in (admin_a, admin_b, tenant_a, tenant_b):
            await client.close()
        await store.close()


@pytest.mark.timeout(180)
async def test_while_redis_is_down_a_router_serves_on_its_config_reloads_and_publishes_when_it_returns(
    stub_fleet: Fleet, tmp_path: Path,
) -> None:
    from tests.faults.redis_server import PrivateRedis

    redis_server = PrivateRedis(tmp_path).start()
    namespace = "hot-reload-outage"
    store = RedisStore.from_url(redis_server.url, namespace)
    keys_file, ticket_keys, admin = credentials(tmp_path, stub_fleet)
    started: list[RouterProcess] = []
    traffic: Traffic | None = None
    clients: list[AsyncSchedulerClient] = []
    try:
        await write_signals(store, stub_fleet)
        router = start_router("a", tmp_path / "a", stub_fleet, keys_file, ticket_keys, namespace, redis_server.url)
        started.append(router)
        no_retry = RetryPolicy(attempts=1)
        operator = AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=admin.key, retry=no_retry)
        tenant = AsyncSchedulerClient(f"127.0.0.1:{router.port}", api_key=admin.tenant_key, retry=no_retry)
        clients += [operator, tenant]
        await routable(operator)
        first = (await operator.route("hi", model=MODEL, max_tokens=8)).config_version
        assert first.startswith("1-")
        traffic = Traffic([("a", tenant)])
        traffic.start(streams_per_client=3)
        await asyncio.sleep(0.5)

        redis_server.kill()
        killed_at = time.monotonic()
        await asyncio.sleep(1.5)
        router.sign_policy(BY_CARBON)
        write_atomically(router.policies / "hot.yaml", BY_CARBON)
        answer = await operator.reload_config()
        # The file watcher may have applied the write before this RPC (then it answers unchanged):
        # either way the new files are in force, locally, and not published.
        assert answer.ok and answer.version != first and answer.version.startswith("local-") and not answer.published
        assert answer.version.startswith("local-") and "unreachable" in answer.publish_error
        local = answer.version

        async def routed_by_carbon() -> bool:
            decision = await operator.route("hi", model=MODEL, max_tokens=8)
            return decision.config_version == local and decision.ranked[0].region == "eu-central"

        await wait_for(routed_by_carbon, 5, "the reload applied while Redis is down")
        await asyncio.sleep(1.0)
        down = traffic.since(killed_at, "a")
        assert down and {d[3] for d in down} <= {first, local} and local in {d[3] for d in down}
        assert not traffic.failures, traffic.failures[:3]

        redis_server.start()  # the same port and data (AOF)
        published = f"2-{local.removeprefix('local-')}"

        async def published_when_back() -> bool:
            return (await operator.route("hi", model=MODEL, max_tokens=8)).config_version == published

        took = await wait_for(published_when_back, 15, "the version published once Redis is back")
        print(f"\nRedis down: reload applied as {local}; published as {published} {took:.2f} s after Redis "
              f"came back; {len(traffic.done)} streams, 0 failed")
        after = RedisStore.from_url(redis_server.url, namespace)  # the test's old connection died with Redis
        try:
            head = await after.get("config:head")
        finally:
            await after.close()
        assert head is not None and b'"counter": 2' in head
        await traffic.stop()
        assert not traffic.failures, traffic.failures[:3]
    finally:
        if traffic is not None:
            await traffic.stop()
        for client in clients:
            await client.close()
        await store.close()
        stop_routers(started)
        redis_server.stop()


async def test_a_router_without_config_files_says_so(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    running = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{running.port}") as client:
        answer = await client.reload_config()
    assert not answer.ok and "without config files" in answer.problems[0].message
