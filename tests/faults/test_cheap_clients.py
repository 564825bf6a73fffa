"""Unauthenticated and slow clients are cheap (issue 26.6): one ``scheduler router`` process,
its gRPC, HTTP front door and /metrics ports under, all at once, thousands of idle connections,
slowloris headers, 5 MiB bodies without a key and slow ones with a key, unauthenticated 8 MiB
gRPC messages, and clients that never read, while a tenant's requests keep being answered on
every port. The router runs with its default connection caps and short timeouts (2-4 s, so
that the test is short); its ledger and audit are on a private Redis.

Judged from outside the process: its RSS and open files (psutil), its own gauges on /metrics
(connections and refusals per port, bytes received, streams held, streams ended because the
client stopped reading), what each attacker saw, and the audit stream (every never-read stream
billed as cancelled). Every figure is printed.

The figures are printed at the end of the session (as the fault suite's table is); run alone:
``.venv/bin/python -m pytest tests/faults/test_cheap_clients.py -p no:cacheprovider``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from scheduler.client import AsyncSchedulerClient
from scheduler.config.loader import load_fleet
from scheduler.server.auth import NewKey, create_key
from scheduler.state import codec, keys
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import StateUnavailable
from scheduler.tickets import TicketKeyRing
from scheduler.types import PoolLiveState, RegionLiveState
from tests.faults.load import FIGURES
from tests.faults.redis_server import PrivateRedis
from tests.h2_raw import DEFAULT_WINDOW, RawH2

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

REGIONS = ("eu-north", "eu-central", "us-east")
MODEL = "llama-3.1-8b"
GENERATE = "/scheduler.v1.GlobalRouter/Generate"
# The router's timeouts here (its defaults are 10 / 30 / 75 / 30 s).
HEADER_S, BODY_S, IDLE_S, WRITE_S = 2.0, 3.0, 4.0, 2.0
# Its sweep runs every min(1 s, the shortest timeout / 4): a limit acts up to that late.
SWEEP_S = 0.5
FIVE_MIB = 5 * 2**20
# The stub's words: a stream that is not read fills the kernel's buffers in a few hundred tokens.
WORD_BYTES = 4096
# Made once: the attackers send slices of them, this process must not spend its time copying.
BODY = b"x" * FIVE_MIB
MESSAGE = b"x" * (8 * 2**20)
# Connections being opened at once (a listen queue takes a burst; the rest wait their turn).
CONNECTING = 200


@dataclass
class Router:
    process: subprocess.Popen[str]
    grpc: int
    http: int
    metrics: int

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.process.pid)


def start_router(work: Path, stub_url: str, redis_url: str, namespace: str, tenant: NewKey, legit: NewKey,
                 extra: Sequence[str] = ("--rate-limit", "100000")) -> Router:
    """A ``scheduler router`` process over ``stub_url`` with the keys of ``tenant`` and ``legit``,
    this test's timeouts and ``extra`` arguments; its ports once it reports them."""
    regions_dir = work / "regions"
    regions_dir.mkdir()
    shipped = {r.name: r for r in load_fleet().regions}
    for name in REGIONS:
        config = shipped[name].model_copy(update={"endpoint": stub_url})
        (regions_dir / f"{name}.yaml").write_text(yaml.safe_dump(config.model_dump(mode="json")))
    (work / "keys.yaml").write_text(yaml.safe_dump({"keys": [tenant.entry_dict(), legit.entry_dict()]}))
    (work / "tickets.yaml").write_text(TicketKeyRing.generate(REGIONS).to_yaml())
    process = subprocess.Popen(
        [sys.executable, "-m", "scheduler.cli", "router", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
         "--metrics-port", "0", "--regions", str(regions_dir), "--state", redis_url, "--namespace", namespace,
         "--keys", str(work / "keys.yaml"), "--ticket-keys", str(work / "tickets.yaml"), "--no-carbon-pollers",
         *extra, "--grace", "1", "--header-timeout", str(HEADER_S), "--body-timeout", str(BODY_S),
         "--idle-timeout", str(IDLE_S), "--write-timeout", str(WRITE_S)],
        stdout=subprocess.PIPE, text=True,
    )
    assert process.stdout is not None
    ports: dict[str, int] = {}
    patterns = {"grpc": r"router listening on [^:]+:(\d+)", "metrics": r"metrics on http://[^:]+:(\d+)",
                "http": r"HTTP front door on http://[^:]+:(\d+)"}
    while len(ports) < 3:
        line = process.stdout.readline()
        if not line:
            process.kill()
            raise AssertionError(f"the router exited before reporting its ports (got {ports})")
        for name, pattern in patterns.items():
            if match := re.search(pattern, line):
                ports[name] = int(match.group(1))
    return Router(process, ports["grpc"], ports["http"], ports["metrics"])


async def publish_live_state(redis_url: str, namespace: str) -> None:
    """What each region's publisher does: its live state every 0.5 s."""
    store = RedisStore.from_url(redis_url, namespace)
    fleet = {r.name: r for r in load_fleet().regions}
    try:
        while True:
            for name in REGIONS:
                pools = {p.name: PoolLiveState() for p in fleet[name].pools}
                state = RegionLiveState(name, True, time.time(), pools)
                with contextlib.suppress(StateUnavailable):  # this process is busy attacking: next time
                    await store.set(keys.region_state(name), codec.encode_region_state(state), ttl_s=30.0)
            await asyncio.sleep(0.5)
    finally:
        await store.close()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(exposition: str) -> Samples:
    samples: Samples = {}
    for line in exposition.splitlines():
        if line.startswith("#") or not line:
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        pairs = frozenset(tuple(pair.split("=", 1)) for pair in re.findall(r'\w+="[^"]*"', labels))
        samples[(name, frozenset((k, v.strip('"')) for k, v in pairs))] = float(value)
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@dataclass
class Watch:
    """The router seen from outside, every 0.2 s: RSS, open files, its /metrics."""

    router: Router
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    http_connections: list[float] = field(default_factory=list)
    metrics_connections: list[float] = field(default_factory=list)
    # (monotonic time, /metrics) of every scrape.
    timeline: list[tuple[float, Samples]] = field(default_factory=list)
    last: Samples = field(default_factory=dict)

    def first(self, since: float, holds: Callable[[Samples], bool]) -> float | None:
        """Seconds from ``since`` to the first scrape where ``holds``."""
        return next((t - since for t, samples in self.timeline if t >= since and holds(samples)), None)

    async def scrape(self, client: httpx.AsyncClient) -> Samples:
        for attempt in range(3):
            try:
                response = await client.get(f"http://127.0.0.1:{self.router.metrics}/metrics", timeout=5)
                break
            except httpx.TransportError:  # a kept-alive connection the router closed as it was reused
                if attempt == 2:
                    raise
        response.raise_for_status()
        self.last = parse(response.text)
        self.timeline.append((time.monotonic(), self.last))
        return self.last

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1)) as client:
            while not stop.is_set():
                ps = self.router.ps
                self.rss.append(ps.memory_info().rss)
                self.fds.append(ps.num_fds())
                samples = await self.scrape(client)
                self.http_connections.append(value(samples, "scheduler_http_connections", port="http"))
                self.metrics_connections.append(value(samples, "scheduler_http_connections", port="metrics"))
                await asyncio.sleep(0.2)


@dataclass
class Legit:
    """A tenant's requests on every port, back to back, during the attack."""

    ok: Counter[str] = field(default_factory=Counter)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: dict[str, list[float]] = field(default_factory=dict)

    async def run(self, router: Router, key: str, stop: asyncio.Event) -> None:
        headers = {"authorization": f"Bearer {key}"}

        async def timed(name: str, call: Callable[[], Awaitable[None]]) -> None:
            started = time.monotonic()
            try:
                await asyncio.wait_for(call(), 10)
            except Exception as exc:
                self.failed[f"{name}: {type(exc).__name__} {str(exc)[:80]}"] += 1
            else:
                self.ok[name] += 1
                self.seconds.setdefault(name, []).append(time.monotonic() - started)

        async with (httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.http}", headers=headers) as http,
                    httpx.AsyncClient(base_url=f"http://127.0.0.1:{router.metrics}") as probe,
                    AsyncSchedulerClient(f"127.0.0.1:{router.grpc}", api_key=key, timeout_s=10) as sdk):
            async def models() -> None:
                (await http.get("/v1/models")).raise_for_status()

            async def completion() -> None:
                answer = await http.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2})
                answer.raise_for_status()
                assert answer.json()["choices"][0]["text"]

            async def generate() -> None:
                assert await sdk.generate("hi", model=MODEL, max_tokens=2).text()

            async def healthz() -> None:
                (await probe.get("/healthz")).raise_for_status()

            while not stop.is_set():
                await asyncio.gather(timed("http models", models), timed("http completion", completion),
                                     timed("grpc generate", generate), timed("metrics healthz", healthz))
                await asyncio.sleep(0.2)


async def read_until_closed(reader: asyncio.StreamReader, within_s: float) -> bytes:
    data = b""
    with contextlib.suppress(ConnectionError, TimeoutError):
        async with asyncio.timeout(within_s):
            while chunk := await reader.read(65536):
                data += chunk
    return data


async def connect(port: int, source: str, gate: asyncio.Semaphore) -> tuple[asyncio.StreamReader,
                                                                          asyncio.StreamWriter]:
    async with gate:
        return await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))


@dataclass
class Closed:
    """One attacker connection: what it was answered, and how long after it connected the server
    closed it (s; this process may open thousands slower than the router closes them)."""

    answer: bytes
    after_s: float


async def idle(port: int, count: int, source: str, gate: asyncio.Semaphore) -> list[Closed]:
    """Connections that send nothing; each waits for the server to close it."""
    async def one() -> Closed:
        reader, writer = await connect(port, source, gate)
        connected = time.monotonic()
        answer = await read_until_closed(reader, 30)
        writer.close()
        return Closed(answer[:200], time.monotonic() - connected)

    return await asyncio.gather(*(one() for _ in range(count)))


async def slowloris(port: int, count: int, source: str, path: str, gate: asyncio.Semaphore) -> list[Closed]:
    """A request line, then a header line every 0.5 s, until the server answers."""
    async def one() -> Closed:
        reader, writer = await connect(port, source, gate)
        connected = time.monotonic()
        writer.write(f"GET {path} HTTP/1.1\r\nhost: router\r\n".encode())
        answer = asyncio.ensure_future(read_until_closed(reader, 30))
        while not answer.done():
            await asyncio.sleep(0.5)
            if not writer.is_closing():
                writer.write(b"x-slow: 1\r\n")
        writer.close()
        return Closed(answer.result()[:200], time.monotonic() - connected)

    return await asyncio.gather(*(one() for _ in range(count)))


@dataclass
class BodyRefusal:
    status: bytes
    answered_after_s: float
    body_sent: int


async def body_without_a_key(port: int, count: int, source: str, trickle: bool,
                             gate: asyncio.Semaphore) -> list[BodyRefusal]:
    """A 5 MiB completions body with a stolen key: trickled at 640 KiB/s (8 s for all of it)
    while reading, or written at once."""
    async def one() -> BodyRefusal:
        reader, writer = await connect(port, source, gate)
        started = time.monotonic()
        writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: router\r\ncontent-type: application/json\r\n"
                     b"authorization: Bearer sk-0123456789ab.stolen\r\ncontent-length: %d\r\n\r\n" % FIVE_MIB)
        answer = asyncio.ensure_future(read_until_closed(reader, 10))
        sent = 0
        with contextlib.suppress(ConnectionError):
            if trickle:
                while not answer.done() and sent < FIVE_MIB:
                    writer.write(BODY[sent:sent + 65536])
                    sent += 65536
                    await asyncio.sleep(0.1)
            else:
                writer.write(BODY)
                sent = FIVE_MIB
                await asyncio.wait_for(writer.drain(), 10)
        data = await answer
        answered = time.monotonic() - started
        writer.close()
        return BodyRefusal(data[:12], answered, sent)

    return await asyncio.gather(*(one() for _ in range(count)))


async def slow_body(port: int, count: int, source: str, key: str, gate: asyncio.Semaphore) -> list[Closed]:
    """A 5 MiB body with a valid key, 64 KiB every 0.5 s."""
    async def one() -> Closed:
        reader, writer = await connect(port, source, gate)
        connected = time.monotonic()
        writer.write(f"POST /v1/completions HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {key}\r\n"
                     f"content-type: application/json\r\ncontent-length: {FIVE_MIB}\r\n\r\n".encode())
        answer = asyncio.ensure_future(read_until_closed(reader, 30))
        sent = 0
        with contextlib.suppress(ConnectionError):
            while not answer.done():
                writer.write(BODY[sent:sent + 65536])
                sent += 65536
                await asyncio.sleep(0.5)
        writer.close()
        return Closed(answer.result()[:200], time.monotonic() - connected)

    return await asyncio.gather(*(one() for _ in range(count)))


async def grpc_without_a_key(port: int, connections: int, streams: int, source: str,
                             gate: asyncio.Semaphore) -> list[tuple[int, bool]]:
    """Per call: bytes of an 8 MiB message the server let in, and whether it ended the call."""
    async def connection() -> list[tuple[int, bool]]:
        async with gate:
            h2 = await RawH2.connect("127.0.0.1", port, local_host=source)
        try:
            calls = await asyncio.gather(*(h2.call(GENERATE, MESSAGE, {"authorization": "Bearer sk-0123456789ab.stolen"},
                                                   send_for_s=2) for _ in range(streams)))
            for _, stream in calls:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream.ended.wait(), 5)
            return [(sent, stream.ended.is_set()) for sent, stream in calls]
        finally:
            h2.close()

    per_connection = await asyncio.gather(*(connection() for _ in range(connections)))
    return [call for calls in per_connection for call in calls]


def completion_request(key: str) -> bytes:
    body = json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2000, "stream": True}).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nhost: router\r\nauthorization: Bearer {key}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body


async def never_reading_socket(port: int, source: str, request: bytes, gate: asyncio.Semaphore) -> socket.socket:
    """A client with a 4 KiB receive buffer that sends ``request`` and never reads."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.bind((source, 0))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    async with gate:
        await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request)
    return sock


async def never_reading_grpc(port: int, source: str, key: str, gate: asyncio.Semaphore) -> RawH2:
    """A Generate call whose client announces a 4 KiB window and never acknowledges a byte."""
    from scheduler.v1 import messages_pb2 as pb

    request = pb.GenerateRequest(model=MODEL, prompt="hi", sampling=pb.SamplingParams(max_tokens=600))
    async with gate:
        h2 = await RawH2.connect("127.0.0.1", port, initial_window=4096, local_host=source)
    await h2.call(GENERATE, request.SerializeToString(), {"authorization": f"Bearer {key}"})
    return h2


def longest(results: list[Closed]) -> float:
    return max(r.after_s for r in results)


def mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


@contextlib.contextmanager
def running(router: Router) -> Iterator[Router]:
    try:
        yield router
    finally:
        router.process.terminate()
        try:
            router.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            router.process.kill()
            router.process.wait(timeout=10)


@contextlib.contextmanager
def stub_region() -> Iterator[str]:
    """A stub region in its own process (this one is busy attacking), a 4 KiB word every
    millisecond (tokens arrive as a region streams them, not all at once); its base URL."""
    process = subprocess.Popen([sys.executable, "-m", "scheduler.server.stub_region", "--port", "0",
                                "--word-bytes", str(WORD_BYTES), "--token-interval-ms", "1"],
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("PORT "), f"the stub region said {line!r}"
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


async def test_unauthenticated_and_slow_clients_are_cheap(own_redis: PrivateRedis, tmp_path: Path) -> None:
    namespace = f"cheap-{uuid.uuid4().hex[:8]}"
    tenant, legit_key = create_key("attacker"), create_key("legit")
    publisher = asyncio.create_task(publish_live_state(own_redis.url, namespace))
    figures: list[str] = []
    with stub_region() as stub_url:
        router = start_router(tmp_path, stub_url, own_redis.url, namespace, tenant, legit_key)
        with running(router):
            watch, legit = Watch(router), Legit()
            async with httpx.AsyncClient() as client:
                for _ in range(100):  # the regions' state reached the router: a tenant is answered
                    answer = await client.post(f"http://127.0.0.1:{router.http}/v1/completions",
                                               headers={"authorization": f"Bearer {legit_key.key}"},
                                               json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
                    if answer.status_code == 200:
                        break
                    await asyncio.sleep(0.1)
                assert answer.status_code == 200, answer.text
                before = await watch.scrape(client)
            rss_before, fds_before = router.ps.memory_info().rss, router.ps.num_fds()
            stop = asyncio.Event()
            watching = asyncio.create_task(watch.run(stop))
            legit_running = asyncio.create_task(legit.run(router, legit_key.key, stop))

            gate = asyncio.Semaphore(CONNECTING)
            # 1. 5 MiB bodies without a key, alone first: what the port reads for them is measurable.
            trickled, blasted = await asyncio.gather(
                body_without_a_key(router.http, 50, "127.0.0.7", True, gate),
                body_without_a_key(router.http, 10, "127.0.0.12", False, gate))
            async with httpx.AsyncClient() as client:
                after_bodies = await watch.scrape(client)
            body_bytes = (value(after_bodies, "scheduler_http_received_bytes_total", port="http")
                          - value(before, "scheduler_http_received_bytes_total", port="http"))
            bodies_rss = max(watch.rss) - rss_before

            # 2. Everything else at once.
            t1 = time.monotonic()
            pipelined = b"GET /metrics HTTP/1.1\r\nhost: router\r\n\r\n" * 16
            (idle_http, idle_grpc, idle_metrics, loris_http, loris_metrics, slow, grpc_refused, unread_http,
             unread_grpc, unread_metrics) = await asyncio.gather(
                idle(router.http, 1200, "127.0.0.2", gate),
                idle(router.grpc, 2000, "127.0.0.3", gate),
                idle(router.metrics, 100, "127.0.0.4", gate),
                slowloris(router.http, 200, "127.0.0.5", "/v1/models", gate),
                slowloris(router.metrics, 30, "127.0.0.6", "/metrics", gate),
                slow_body(router.http, 20, "127.0.0.8", tenant.key, gate),
                grpc_without_a_key(router.grpc, 10, 10, "127.0.0.9", gate),
                asyncio.gather(*(never_reading_socket(router.http, "127.0.0.10", completion_request(tenant.key), gate)
                                 for _ in range(20))),
                asyncio.gather(*(never_reading_grpc(router.grpc, "127.0.0.11", tenant.key, gate) for _ in range(20))),
                asyncio.gather(*(never_reading_socket(router.metrics, "127.0.0.13", pipelined, gate)
                                 for _ in range(8))))

            def unread_ended(samples: Samples) -> bool:
                """Every never-read stream ended by the router, its slot back."""
                return (value(samples, "scheduler_http_refused_total", port="http", reason="write-timeout") == 20
                        and value(samples, "scheduler_router_stalled_streams_total", reason="write-timeout") == 20
                        and not value(samples, "scheduler_router_tenant_streams", tenant="attacker"))

            def metrics_port_free(samples: Samples) -> bool:
                # Left: two scrapers (this test's, the watch's) and the tenant's prober.
                return value(samples, "scheduler_http_connections", port="metrics") <= 3

            async with httpx.AsyncClient() as client:
                deadline = time.monotonic() + IDLE_S + 10
                while not (unread_ended(watch.last) and metrics_port_free(watch.last)):
                    assert time.monotonic() < deadline, "; ".join(
                        f"{name}{dict(labels)} {n:g}" for (name, labels), n in sorted(watch.last.items())
                        if "stream" in name or "connections" in name or "refused" in name)
                    await asyncio.sleep(0.2)
                    await watch.scrape(client)
            await asyncio.sleep(1.0)  # the legitimate tenant goes on a little after the attack
            stop.set()
            await asyncio.gather(watching, legit_running)
            for sock in unread_http + unread_metrics:
                sock.close()
            for h2 in unread_grpc:
                h2.close()
            await asyncio.sleep(0.5)
            async with httpx.AsyncClient() as client:
                final = await watch.scrape(client)
            rss_after, fds_after = router.ps.memory_info().rss, router.ps.num_fds()
            peak_rss, peak_fds = max(watch.rss), max(watch.fds)
            unread_cut_at = watch.first(t1, unread_ended)
            peak_at = max((t for t, samples in watch.timeline if t >= t1),
                          key=lambda t: value(dict(watch.timeline)[t], "scheduler_http_connections", port="metrics"))
            metrics_free_at = watch.first(peak_at, metrics_port_free)
        # Stopped (SIGTERM): the ledger and the audit writer flushed.
    publisher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await publisher
    store = RedisStore.from_url(own_redis.url, namespace)
    try:
        audit = [fields for _, fields in await store.xrange(keys.AUDIT, 10_000)]
    finally:
        await store.close()
    billed = Counter((e["tenant"], e["end_reason"]) for e in audit)

    refused = {port: {reason: value(final, "scheduler_http_refused_total", port=port, reason=reason)
                      for reason in ("connections-per-client", "header-timeout", "body-timeout", "write-timeout",
                                     "refused", "body-too-large")}
               for port in ("http", "metrics")}
    unauth_sent = [sent for sent, _ in grpc_refused]
    latencies = {name: f"p50 {statistics.median(s) * 1000:.0f} ms, max {max(s) * 1000:.0f} ms"
                 for name, s in legit.seconds.items()}
    figures += [
        f"router RSS: {mib(rss_before)} before, +{mib(bodies_rss)} after the bodies without a key, peak "
        f"{mib(peak_rss)} in the rest of the attack, {mib(rss_after)} after (+{mib(peak_rss - rss_before)} at peak)",
        f"router open files: {fds_before} before, peak {peak_fds}, {fds_after} after",
        f"HTTP port connections (router's gauge): peak {max(watch.http_connections):.0f}; "
        f"/metrics port: peak {max(watch.metrics_connections):.0f}",
        f"5 MiB bodies without a key: {len(trickled)} trickled, 401 after at most "
        f"{max(r.answered_after_s for r in trickled) * 1000:.0f} ms with at most "
        f"{max(r.body_sent for r in trickled) // 1024} KiB of the body sent; {len(blasted)} written at once: "
        f"{sum(r.status.startswith(b'HTTP/1.1 401') for r in blasted)} read their 401 before the reset; "
        f"the HTTP port read {body_bytes / 1024:.0f} KiB for all {len(trickled) + len(blasted)} "
        f"({body_bytes / (len(trickled) + len(blasted)) / 1024:.1f} KiB each; the bodies were "
        f"{mib((len(trickled) + len(blasted)) * FIVE_MIB)})",
        f"idle HTTP: {len(idle_http)} opened from one address, "
        f"{sum(c.answer.startswith(b'HTTP/1.1 503') for c in idle_http)} refused (per-address cap 1,000), "
        f"the others closed at most {longest(idle_http):.1f} s after connecting (header timeout {HEADER_S:g} s)",
        f"idle gRPC: {len(idle_grpc)} opened, closed at most {longest(idle_grpc):.1f} s after connecting (handshake "
        f"timeout {HEADER_S:g} s)",
        f"idle /metrics: {len(idle_metrics)} opened, "
        f"{sum(c.answer.startswith(b'HTTP/1.1 503') for c in idle_metrics)} refused (per-address cap 8), "
        f"the others closed at most {longest(idle_metrics):.1f} s after connecting",
        f"slowloris: HTTP {dict(Counter(c.answer[:12].decode() for c in loris_http))} at most "
        f"{longest(loris_http):.1f} s after connecting; /metrics "
        f"{dict(Counter(c.answer[:12].decode() for c in loris_metrics))} at most {longest(loris_metrics):.1f} s",
        f"slow 5 MiB bodies with a key: {dict(Counter(c.answer[:12].decode() for c in slow))} at most "
        f"{longest(slow):.1f} s after connecting (body timeout {BODY_S:g} s)",
        f"gRPC without a key: {len(grpc_refused)} calls of 8 MiB on 10 connections, "
        f"{sum(ended for _, ended in grpc_refused)} ended by the router; at most {max(unauth_sent):,} bytes of a "
        f"message let in ({sum(unauth_sent) / 2**20:.1f} MiB for all)",
        f"never read: 20 HTTP and 20 gRPC streams ended (write timeout {WRITE_S:g} s) by {unread_cut_at:.1f} s; "
        f"the /metrics port back to its scrapers by {metrics_free_at:.1f} s after its peak (8 clients that never "
        f"read 16 pipelined answers, idle timeout {IDLE_S:g} s); billed: {dict(billed)}",
        f"refusals by the router: {refused}",
        f"legitimate tenant during the attack: {dict(legit.ok)} ok, {dict(legit.failed) or 'none'} failed; "
        f"{latencies}",
    ]
    FIGURES["unauthenticated and slow clients are cheap (tests/faults/test_cheap_clients.py)"] = figures
    print("\n" + "\n".join(f"  {line}" for line in figures))

    assert not legit.failed and all(legit.ok[name] >= 3 for name in ("http models", "http completion",
                                                                        "grpc generate", "metrics healthz")), legit
    # Memory and connections stay bounded. 300 MiB of bodies without a key cost next to nothing;
    # the rest (about 90 MiB on the 2-core host) is 2,000 gRPC connections in gRPC core (13 KiB
    # each) and the 40 streams that are not read, each holding its region's read-ahead (up to
    # 1 MiB) until the write timeout ends it.
    assert bodies_rss < 32 * 2**20, f"the bodies without a key grew the router by {mib(bodies_rss)}"
    assert peak_rss - rss_before < 192 * 2**20, f"the router grew by {mib(peak_rss - rss_before)}"
    # One address holds at most 1,000 (the idle ones); the other attackers and the tenant the rest.
    assert max(watch.http_connections) <= 1_000 + 200 + 20 + 20 + 3
    assert max(watch.metrics_connections) <= 8 * 3 + 3  # three attacking addresses, 8 each
    assert fds_after < fds_before + 50, (fds_before, fds_after)
    assert value(final, "scheduler_http_connections", port="http") <= 2
    # No body read before the key: 401 long before the trickle could have sent it, and the port
    # read at most the headers and the first read's worth of each.
    # (Trickled, a whole body takes 8 s to send.)
    assert all(r.status.startswith(b"HTTP/1.1 401") for r in trickled)
    assert max(r.answered_after_s for r in trickled) < 3.0
    assert max(r.body_sent for r in trickled) < 2 * 2**20
    assert body_bytes <= (len(trickled) + len(blasted)) * 256 * 1024
    assert max(unauth_sent) <= DEFAULT_WINDOW and all(ended for _, ended in grpc_refused)
    # Idle, slow and silent clients are closed by their timeouts (plus the sweep's resolution).
    margin = 2 * SWEEP_S + 1.5
    assert longest(idle_http) < HEADER_S + margin and longest(idle_metrics) < HEADER_S + margin
    assert longest(idle_grpc) < HEADER_S + margin + 1.0  # gRPC core's own timer
    assert all(c.answer.startswith(b"HTTP/1.1 408") for c in loris_http) and longest(loris_http) < HEADER_S + margin
    assert all(c.answer.startswith((b"HTTP/1.1 408", b"HTTP/1.1 503")) for c in loris_metrics)
    assert all(c.answer.startswith(b"HTTP/1.1 408") for c in slow) and longest(slow) < BODY_S + margin
    # Never-read streams ended and billed as cancelled; their slots are back.
    # (A stream stalls once its kernel buffers are full: a second or two, then the write timeout.)
    assert unread_cut_at is not None and unread_cut_at < WRITE_S + margin + 4.0
    assert metrics_free_at is not None and metrics_free_at < IDLE_S + margin
    assert billed[("attacker", "cancelled")] == 40 and billed[("attacker", "complete")] == 0
