"""Billing chaos: every ticket that reached an engine is billed once, on at least what the
engine did, through client aborts, a router SIGKILLed mid-stream, a Redis restart and a
region gateway restart.

Real: two routers (``scheduler router`` processes with ticket keys, ledger, audit and the
region-receipt ingest), the private ``redis-server`` they and the regions share (restarted
by its PID, AOF on), the SDK and plain HTTP clients, and three regions whose gateway is the
real ``RegionGateway`` (tickets, relay, signed receipts and their outbox, live-state
publisher), each in a process of its own (``tests.region_host``) restarted by its PID.
Simulated: Ray Serve and vLLM. Each region hosts its gateway in uvicorn, and each pool's
engine is a stub that streams as vLLM does and tallies the prompt tokens it prefilled and
the tokens it handed over to a file; that tally is "what the engine reports".

Load for ``LOAD_S``: SDK clients on each router (proxy mode), and direct-mode clients that
call ``Route`` and stream from every target of the answer in parallel. Each request aborts
at a random token k (none for about half of them; k = 0 is a cancel during the prefill).
Proxy clients declare a prompt of the fewest tokens the router accepts, all of them cached,
so a bill on client-declared counts would fall short. Faults: router A is SIGKILLed with
streams open, Redis is killed and restarted 2 s later (receipts signed meanwhile wait in the
regions' outboxes and the routers' queues), eu-north's gateway is stopped while it streams
(no grace: its open streams are cut) and started again on its port.

Then: the gateways are stopped (their outboxes flushed), router B books the region receipts
and stops. The books must show, per (decision, region, pool) that an engine worked on,
exactly one ledger entry, billing at least the prompt and completion tokens that engine
reports; no entry for anything else; the month's hash equal to the sum of its entries.

Run alone, with the figures: ``.venv/bin/python -m pytest tests/faults/test_billing_chaos.py
-p no:cacheprovider -s``.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
import redis
import yaml

from scheduler.client import AsyncSchedulerClient, RetryPolicy, SchedulerRpcError
from scheduler.client import direct as sdk_direct
from scheduler.client.common import build_request
from scheduler.config.loader import load_fleet
from scheduler.ledger.ledger import FIELDS, month_of
from scheduler.signed_region_receipt import verify_receipt
from scheduler.tickets import KEYS_FILE_ENV, TicketKeyRing
from scheduler.v1 import router_pb2, router_pb2_grpc
from tests.faults.redis_server import PrivateRedis, free_port
from tests.region_host import TAG, read_tallies

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("eu-north", "eu-central", "us-east")
MODEL = "llama-3.1-8b"
TENANT = "local"  # routers run --insecure: every caller is the local tenant
MAX_TOKENS = 30
# eu-north, restarted mid-load, streams slower: its streams are open long enough to be cut.
TOKEN_INTERVAL_MS = {"eu-north": 50, "eu-central": 20, "us-east": 20}
LOAD_S = 14.0
KILL_ROUTER_AT_S, REDIS_DOWN_AT_S, REDIS_DOWN_S, GATEWAY_RESTART_AT_S = 3.0, 5.5, 2.0, 9.5
PROXY_WORKERS_PER_ROUTER = 3
DIRECT_WORKERS = 2
NO_RETRY = RetryPolicy(attempts=1)  # one decision per request id: the books are checked per request


@dataclass
class Child:
    """A process of the test's own, started and stopped by its handle; its output goes to ``log``."""

    command: list[str]
    log: Path
    ready: re.Pattern[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    port: int = 0

    async def start(self, timeout_s: float = 60.0) -> Child:
        offset = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env)
        give_up_at = time.monotonic() + timeout_s
        while True:
            match = self.ready.search(self.log.read_bytes()[offset:].decode(errors="replace"))
            if match:
                self.port = int(match.group(1))
                return self
            if self.process.poll() is not None or time.monotonic() > give_up_at:
                self.stop(signal.SIGKILL)
                raise AssertionError(f"{self.command[:4]} did not start; see {self.log}")
            await asyncio.sleep(0.05)

    def stop(self, how: signal.Signals = signal.SIGTERM, timeout_s: float = 20.0) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(how)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            raise AssertionError(f"{self.command[:4]} did not stop within {timeout_s} s of {how.name}") from None


@dataclass
class Load:
    """What the clients did."""

    requests: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    cut: Counter[str] = field(default_factory=Counter)  # streams that failed after text, by router/target
    errors: Counter[str] = field(default_factory=Counter)
    route_targets: Counter[int] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


def abort_at(rng: random.Random) -> int | None:
    """None: read to the end; k: hang up after k text chunks (0: during the prefill)."""
    k = rng.randrange(2 * MAX_TOKENS)
    return k if k < MAX_TOKENS else None


def prompt(rid: str) -> str:
    return f"{TAG}{rid}] " + "billing chaos " * 20


async def consume(chunks: AsyncGenerator[object, None], k: int | None,
                  first_text_s: float = 0.02) -> tuple[int, Exception | None]:
    """Read ``chunks`` to the end, or until k came and then hang up (k = 0: after
    ``first_text_s``, before the engine's first token). (chunks read, the error that ended
    the stream early)."""
    seen = 0
    failed: Exception | None = None
    reached = asyncio.Event()

    async def read() -> None:
        nonlocal seen, failed
        try:
            async for _ in chunks:
                seen += 1
                if k is not None and seen >= k:
                    reached.set()
                    await asyncio.Event().wait()  # hold the stream open until cancelled
        except Exception as exc:
            failed = exc

    reader = asyncio.create_task(read())
    waiter = asyncio.create_task(reached.wait())
    await asyncio.wait({reader, waiter}, timeout=first_text_s if k == 0 else None,
                       return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    reader.cancel()
    await asyncio.gather(reader, waiter, return_exceptions=True)
    await chunks.aclose()  # hang up now, not when the garbage collector finds the stream
    return seen, failed


def tally(load: Load, kind: str, k: int | None, seen: int, failed: Exception | None) -> None:
    if failed is None:
        load.aborted += k is not None and seen >= k
        return
    code = failed.code.name if isinstance(failed, SchedulerRpcError) else type(failed).__name__
    load.errors[f"{kind} {code}"] += 1
    if seen:
        load.cut[kind] += 1


async def proxy_worker(port: int, name: str, load: Load, rng: random.Random) -> None:
    kind = name[:7]
    async with AsyncSchedulerClient(f"127.0.0.1:{port}", timeout_s=20, retry=NO_RETRY) as client:
        while not load.stop.is_set():
            rid = f"{name}-{uuid.uuid4().hex[:10]}"
            text = prompt(rid)
            least = math.ceil(len(text.encode()) / 128)
            generation = client.generate(text, model=MODEL, max_tokens=MAX_TOKENS, request_id=rid,
                                         workload_class="batch", prompt_tokens=least, cached_tokens=least)
            load.requests[kind] += 1
            k = abort_at(rng)
            seen, failed = await consume(generation.__aiter__(), k)  # type: ignore[arg-type]
            tally(load, kind, k, seen, failed)
            if failed is not None and kind == "proxy-a" and router_gone(failed):
                return  # router A is gone


def router_gone(failed: Exception) -> bool:
    return isinstance(failed, SchedulerRpcError) and failed.code.name in ("UNAVAILABLE", "CANCELLED", "UNKNOWN")


async def direct_worker(port: int, name: str, load: Load, rng: random.Random) -> None:
    """Route, then every target of the answer at once, each aborted at its own k."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel, httpx.AsyncClient(timeout=20) as http:
        router = router_pb2_grpc.GlobalRouterStub(channel)  # type: ignore[no-untyped-call]
        while not load.stop.is_set():
            rid = f"{name}-{uuid.uuid4().hex[:10]}"
            request = build_request(prompt=prompt(rid), model=MODEL, max_tokens=MAX_TOKENS, request_id=rid,
                                    workload_class="batch", decision_detail="summary")
            load.requests["direct"] += 1
            try:
                routed = await router.Route(request, timeout=10)
            except grpc.aio.AioRpcError as exc:
                load.errors[f"route {exc.code().name}"] += 1
                await asyncio.sleep(0.1)
                continue
            load.route_targets[len(routed.targets)] += 1

            bodies = [sdk_direct.region_payload(request, target, routed.decision) for target in routed.targets]
            await asyncio.gather(*(direct_stream(http, target, body, load, rng)
                                   for target, body in zip(routed.targets, bodies, strict=True)))


async def direct_stream(http: httpx.AsyncClient, target: router_pb2.DirectTarget, body: bytes, load: Load,
                        rng: random.Random) -> None:
    async def chunks() -> AsyncGenerator[str, None]:
        async with http.stream("POST", target.url, content=body, headers=sdk_direct.headers(target)) as reply:
            if reply.status_code != 200:
                raise httpx.HTTPStatusError(f"HTTP {reply.status_code}", request=reply.request, response=reply)
            async for line in reply.aiter_lines():
                if line.startswith("data: {") and '"choices":[{' in line:
                    yield line

    k = abort_at(rng)
    seen, failed = await consume(chunks(), k)
    tally(load, "direct", k, seen, failed)


@dataclass
class Books:
    entries: dict[tuple[str, str, str], dict[str, float]]  # (decision, region, pool) -> booked fields
    month: dict[str, float]  # the ledger hash, summed by field kind
    requests_by_rid: dict[str, str]  # request id -> decision id (the audit stream)
    end_reasons: Counter[str]


def read_books(url: str, namespace: str) -> Books:
    prefix = f"sched:{namespace}:"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        entries: dict[tuple[str, str, str], dict[str, float]] = {}
        for key in client.scan_iter(match=f"{prefix}ledger_entry:*", count=1000):
            decision, region, pool = key[len(prefix) + len("ledger_entry:"):].split(":")
            fields = client.hgetall(key)
            by_kind: dict[str, float] = {k: 0.0 for k in FIELDS}
            for name, value in fields.items():
                if not name.startswith("."):
                    by_kind[name.rsplit("|", 1)[1]] += float(value)
            entries[(decision, region, pool)] = by_kind
        month = {k: 0.0 for k in FIELDS}
        for name, value in client.hgetall(f"{prefix}ledger:{TENANT}:{month_of(time.time())}").items():
            month[name.rsplit("|", 1)[1]] += float(value)
        requests_by_rid: dict[str, str] = {}
        end_reasons: Counter[str] = Counter()
        for _, audit in client.xrange(f"{prefix}audit"):
            if "decision_id" in audit:
                assert requests_by_rid.setdefault(audit["request_id"], audit["decision_id"]) == audit["decision_id"]
                end_reasons[audit["end_reason"]] += 1
        return Books(entries, month, requests_by_rid, end_reasons)
    finally:
        client.close()


async def until_streaming(endpoint: str, streams: int = 2, timeout_s: float = 5.0) -> None:
    """Until the region has ``streams`` open (its published ``running`` and ``queue_depth``)."""
    give_up_at = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=2) as http:
        while True:
            state = (await http.get(f"{endpoint}/state")).json()
            if sum(pool["running"] + pool["queue_depth"] for pool in state["pools"].values()) >= streams:
                return
            assert time.monotonic() < give_up_at, f"fewer than {streams} streams open at {endpoint}"
            await asyncio.sleep(0.02)


def region_receipts(url: str, namespace: str, ring: TicketKeyRing) -> list[dict[str, Any]]:
    """The claims of every receipt the regions signed (verified)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        claims = [verify_receipt(ring.of(entry["region"]), entry) for _, entry in client.xrange(f"sched:{namespace}:receipts")]
        return [c for c in claims if c.get("kind") != "idle"]  # a pool's idle energy of a window (none here: no meter)
    finally:
        client.close()


async def wait_for_ingest(url: str, namespace: str, timeout_s: float = 30.0) -> None:
    """Until the receipt ingest's cursor reached the receipts stream's last entry."""
    prefix = f"sched:{namespace}:"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        give_up_at = time.monotonic() + timeout_s
        while True:
            last = client.xrevrange(f"{prefix}receipts", count=1)
            if not last or client.get(f"{prefix}receipts:cursor") == last[0][0]:
                return
            assert time.monotonic() < give_up_at, "the routers did not book every region receipt"
            await asyncio.sleep(0.2)
    finally:
        client.close()


async def test_every_used_ticket_is_billed_once_on_the_engines_counts(own_redis: PrivateRedis, tmp_path: Path) -> None:
    started = time.monotonic()
    namespace = f"chaos-{uuid.uuid4().hex[:8]}"
    keys_file = tmp_path / "ticket-keys.yaml"
    ring = TicketKeyRing.generate(REGIONS)
    keys_file.write_text(ring.to_yaml())
    env = {**os.environ, KEYS_FILE_ENV: str(keys_file), "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    ports = {name: free_port() for name in REGIONS}
    tallies = [tmp_path / f"tally-{name}.jsonl" for name in REGIONS]
    hosts = {name: Child([sys.executable, "-m", "tests.region_host", "--region", name, "--port", str(ports[name]),
                          "--state", own_redis.url, "--namespace", namespace, "--tally", str(tally),
                          "--token-interval-ms", str(TOKEN_INTERVAL_MS[name]), "--grace-s", "0"],
                         tmp_path / f"{name}.log", re.compile(r"PORT (\d+)"), env)
             for name, tally in zip(REGIONS, tallies, strict=True)}
    regions_dir = tmp_path / "regions"
    regions_dir.mkdir()
    for config in load_fleet().regions:
        if config.name in REGIONS:
            region = config.model_copy(update={"endpoint": f"http://127.0.0.1:{ports[config.name]}"})
            (regions_dir / f"{config.name}.yaml").write_text(yaml.safe_dump(region.model_dump(mode="json")))
    router_command = [sys.executable, "-m", "scheduler.cli", "router", "--port", "0", "--regions", str(regions_dir),
                      "--state", own_redis.url, "--namespace", namespace, "--ticket-keys", str(keys_file),
                      "--insecure", "--no-carbon-pollers", "--refresh-interval", "0.5", "--grace", "1",
                      "--rate-limit", "100000"]
    routers = {name: Child(router_command, tmp_path / f"router-{name}.log",
                           re.compile(r"router listening on [^:]+:(\d+)"), env) for name in ("a", "b")}
    children = [*hosts.values(), *routers.values()]
    load = Load()
    rng = random.Random(25)
    phases: dict[str, float] = {}
    try:
        await asyncio.gather(*(child.start() for child in children))
        phases["start"] = time.monotonic() - started
        await asyncio.sleep(2.0)  # the regions' live state reaches the routers' snapshots
        workers = [
            *(proxy_worker(routers["a"].port, f"proxy-a{i}", load, rng) for i in range(PROXY_WORKERS_PER_ROUTER)),
            *(proxy_worker(routers["b"].port, f"proxy-b{i}", load, rng) for i in range(PROXY_WORKERS_PER_ROUTER)),
            *(direct_worker(routers["b"].port, f"direct{i}", load, rng) for i in range(DIRECT_WORKERS)),
        ]
        running = asyncio.gather(*workers)
        t0 = time.monotonic()

        async def at(offset_s: float) -> None:
            await asyncio.sleep(max(0.0, t0 + offset_s - time.monotonic()))

        await at(KILL_ROUTER_AT_S)
        routers["a"].stop(signal.SIGKILL)
        await at(REDIS_DOWN_AT_S)
        await asyncio.to_thread(own_redis.kill)
        outage = (time.time(), 0.0)
        await asyncio.sleep(REDIS_DOWN_S)
        await asyncio.to_thread(own_redis.start)
        outage = (outage[0], time.time())
        await at(GATEWAY_RESTART_AT_S)
        await until_streaming(f"http://127.0.0.1:{ports['eu-north']}")
        restart = (time.time(), 0.0)
        await asyncio.to_thread(hosts["eu-north"].stop)
        restart = (restart[0], time.time())
        await hosts["eu-north"].start()
        await at(LOAD_S)
        load.stop.set()
        await asyncio.wait_for(running, 60)
        phases["load"] = time.monotonic() - t0
        # The regions stop: streams still open are cut and every receipt reaches the store;
        # then router B books them all and stops (its ledger and audit flushed).
        settle = time.monotonic()
        await asyncio.gather(*(asyncio.to_thread(host.stop) for host in hosts.values()))
        await wait_for_ingest(own_redis.url, namespace)
        await asyncio.to_thread(routers["b"].stop)
        phases["settle"] = time.monotonic() - settle
        books = read_books(own_redis.url, namespace)
        receipts = region_receipts(own_redis.url, namespace, ring)
    finally:
        for child in children:
            child.stop(signal.SIGKILL)
    engines = read_tallies(tallies)

    # Per (decision, region, pool) an engine worked on: one entry, at least the engine's tokens.
    missing, short = [], []
    for (region, pool, rid), (prompt_tokens, generated) in engines.items():
        decision = books.requests_by_rid.get(rid)
        entry = books.entries.get((decision or "", region, pool))
        if entry is None:
            missing.append((rid, region, pool, (prompt_tokens, generated), decision))
        elif entry["prompt_tokens"] < prompt_tokens or entry["completion_tokens"] < generated:
            short.append((rid, region, pool, (prompt_tokens, generated),
                          (entry["prompt_tokens"], entry["completion_tokens"])))
    worked_on = {(books.requests_by_rid.get(rid, ""), region, pool) for region, pool, rid in engines}
    phantom = set(books.entries) - worked_on
    engine_tokens = [sum(t[i] for t in engines.values()) for i in (0, 1)]
    billed_tokens = [sum(e[k] for e in books.entries.values()) for k in ("prompt_tokens", "completion_tokens")]
    while_down = sum(1 for r in receipts if outage[0] <= r["at"] <= outage[1])
    cut_by_restart = sum(1 for r in receipts if r["region"] == "eu-north" and r["partial"]
                         and restart[0] <= r["at"] <= restart[1])
    took = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items())
    print(f"\nbilling chaos, {time.monotonic() - started:.1f} s ({took}): requests {dict(load.requests)}, aborted by "
          f"clients {load.aborted}, cut streams seen by clients {dict(load.cut)}, client errors {dict(load.errors)}, "
          f"Route targets {dict(load.route_targets)}; receipts signed while Redis was down {while_down}, streams "
          f"the gateway restart cut {cut_by_restart}\n"
          f"  engines worked on {len(engines)} (decision, region, pool); ledger entries {len(books.entries)}; "
          f"missing {len(missing)}, short {len(short)}, phantom {len(phantom)}; audit end reasons "
          f"{dict(books.end_reasons)}\n"
          f"  tokens engines reported prompt {engine_tokens[0]} / completion {engine_tokens[1]}; billed "
          f"{billed_tokens[0]:.0f} / {billed_tokens[1]:.0f}; month hash requests {books.month['requests']:.0f}")
    assert not missing and not short and not phantom, (missing[:5], short[:5], sorted(phantom)[:5])
    assert billed_tokens[0] >= engine_tokens[0] and billed_tokens[1] >= engine_tokens[1]
    # Exactly one ledger entry each: the month's hash is the sum of its entries.
    assert books.month["requests"] == len(books.entries) == len(engines)
    for kind in FIELDS:
        assert books.month[kind] == pytest.approx(sum(e[kind] for e in books.entries.values()), rel=1e-9), kind
    # The faults did what they are for: clients aborted, Routes had three targets, router A's
    # death cut streams after their first token, eu-north's restart cut streams, receipts
    # waited out Redis.
    assert load.route_targets[3] > 0 and load.aborted > 20
    assert books.end_reasons["cancelled"] > 20 and books.end_reasons["complete"] > 20
    assert load.cut["proxy-a"] > 0 and cut_by_restart > 0 and while_down > 0, (dict(load.cut), cut_by_restart)
