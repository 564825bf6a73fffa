"""The fuzz suite's router: one live router (real gRPC on port 0, three stub regions over real
HTTP) shared by every fuzz case of a module, a raw-bytes client for it, and the tally the
suite prints at the end (cases per method and per status code, the router process's RSS).

The fuzz tests are synchronous Hypothesis tests; the router, its stub regions and the client
channel live on one event loop the fixture owns, and each case runs on it to completion.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import os
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
import psutil
import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import load_fleet
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.server.app import RunningRouter, build_deps, start_router
from scheduler.server.auth import KeyRing, create_key
from scheduler.server.stub_region import StubRegion, StubRegionSettings
from scheduler.state import codec, keys
from scheduler.state.memory_store import MemoryStore
from scheduler.types import PoolLiveState, RegionLiveState
from scheduler.v1.messages_pb2 import GenerateRequest, SamplingParams

ROUTE = "/scheduler.v1.GlobalRouter/Route"
GENERATE = "/scheduler.v1.GlobalRouter/Generate"
LIST_REGIONS = "/scheduler.v1.GlobalRouter/ListRegions"
SET_ENERGY_ROUTING = "/scheduler.v1.RouterAdmin/SetEnergyRouting"
GET_STATUS = "/scheduler.v1.RouterAdmin/GetStatus"
GET_CANARY_STATUS = "/scheduler.v1.RouterAdmin/GetCanaryStatus"
SET_CANARY_ARM = "/scheduler.v1.RouterAdmin/SetCanaryArm"
FUZZ_REGIONS = ("eu-north", "eu-central", "us-east")
CALL_TIMEOUT_S = 30.0
PUBLISH_INTERVAL_S = 0.5
MAX_RSS_GROWTH_BYTES = 100 * 2**20
# A Generate case reads at most this many stream messages, then cancels.
MAX_STREAM_MESSAGES = 64
CLIENT_MESSAGE_BYTES = 64 * 2**20
# Cases across the whole fuzz suite: 1,000 in `make test`, `make fuzz` sets 10,000.
TOTAL_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "1000"))

T = TypeVar("T")
# The suite's summary lines, printed by pytest_terminal_summary (filled at fixture teardown).
REPORT: list[str] = []


def examples(share: float) -> int:
    """This test's part of ``TOTAL_EXAMPLES``."""
    return max(1, round(TOTAL_EXAMPLES * share))


@dataclass(frozen=True)
class Outcome:
    method: str
    code: grpc.StatusCode
    details: str
    # The status message plus every binary trailing metadata value (the google.rpc details).
    details_bytes: int
    responses: tuple[bytes, ...] = ()
    cancelled_by_client: bool = False


@dataclass
class Tally:
    cases: int = 0
    by_method: Counter[str] = field(default_factory=Counter)
    by_code: Counter[str] = field(default_factory=Counter)
    by_method_code: Counter[tuple[str, str]] = field(default_factory=Counter)
    largest_details_bytes: int = 0

    def add(self, outcome: Outcome) -> None:
        code = "CANCELLED (by the client)" if outcome.cancelled_by_client else outcome.code.name
        self.cases += 1
        self.by_method[outcome.method] += 1
        self.by_code[code] += 1
        self.by_method_code[(outcome.method, code)] += 1
        self.largest_details_bytes = max(self.largest_details_bytes, outcome.details_bytes)

    def lines(self) -> list[str]:
        out = [f"cases run: {self.cases:,}; largest error details: {self.largest_details_bytes:,} bytes"]
        out += [f"  {method}: {count:,}" for method, count in sorted(self.by_method.items())]
        out += ["status codes:"] + [f"  {code}: {count:,}" for code, count in sorted(self.by_code.items())]
        out += ["per method and code:"]
        out += [f"  {method} {code}: {count:,}" for (method, code), count in sorted(self.by_method_code.items())]
        return out


def _details_bytes(details: str | None, trailing: Any) -> int:
    return len((details or "").encode()) + sum(len(v) for _, v in (trailing or ()) if isinstance(v, bytes))


@dataclass
class LiveRouter:
    """A started router and a raw client: requests go out as bytes, answers come back as bytes."""

    loop: asyncio.AbstractEventLoop
    router: RunningRouter
    channel: grpc.aio.Channel
    credentials: dict[str, str]
    stubs: list[StubRegion]
    publisher: asyncio.Task[None]
    tally: Tally = field(default_factory=Tally)

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(work)

    def metadata(self, credential: str) -> tuple[tuple[str, str], ...]:
        """``credential``: a key name in ``credentials``, '' (none) or a literal header value."""
        if not credential:
            return ()
        return (("authorization", self.credentials.get(credential, credential)),)

    async def unary(self, method: str, request: bytes, credential: str) -> Outcome:
        call = self.channel.unary_unary(method)
        try:
            response = await call(request, metadata=self.metadata(credential), timeout=CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            return Outcome(method, error.code(), error.details() or "",
                           _details_bytes(error.details(), error.trailing_metadata()))
        return Outcome(method, grpc.StatusCode.OK, "", 0, (response,))

    async def stream(self, method: str, request: bytes, credential: str, read_at_most: int) -> Outcome:
        """Read up to ``read_at_most`` messages (then cancel) or to the stream's end."""
        call = self.channel.unary_stream(method)(request, metadata=self.metadata(credential), timeout=CALL_TIMEOUT_S)
        responses: list[bytes] = []
        cancelled = False
        try:
            async for response in call:
                responses.append(response)
                if len(responses) >= read_at_most:
                    cancelled = call.cancel()
                    break
        except grpc.aio.AioRpcError:
            pass  # the status is read below
        code = await call.code()
        details = await call.details()
        return Outcome(method, code, details or "", _details_bytes(details, await call.trailing_metadata()),
                       tuple(responses), cancelled)


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


def trim_heap() -> None:
    """Hand freed heap pages back to the OS. The cases are drawn in this process too (a
    100,000-entry list, a 9 MiB prompt), and glibc keeps freed pages mapped: without this the
    process's RSS is the drafts' high-water mark (over 1 GB for 2,000 drafts), not what it holds."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def settled_rss_bytes() -> int:
    """RSS after a full collection and ``trim_heap``: the memory the process still holds."""
    gc.collect()
    trim_heap()
    return rss_bytes()


async def _start(loop: asyncio.AbstractEventLoop) -> LiveRouter:
    fleet = load_fleet()
    shipped = {r.name: r for r in fleet.regions}
    stubs = [await StubRegion(StubRegionSettings(name=name)).start() for name in FUZZ_REGIONS]
    configs = tuple(shipped[s.settings.name].model_copy(update={"endpoint": s.endpoint}) for s in stubs)
    tenant, admin = create_key("acme"), create_key("ops", admin=True)
    store = MemoryStore()
    publisher = asyncio.create_task(_publish_live_state(store, configs))
    deps = build_deps(SnapshotBuilder(compile_fleet(configs), compile_policy(fleet.policy("default"))), store, "memory",
                      keys=KeyRing.of([tenant.entry, admin.entry]), rate_limit_rps=1e6)
    router = await start_router("127.0.0.1:0", deps)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{router.port}", options=[
        ("grpc.max_send_message_length", CLIENT_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", CLIENT_MESSAGE_BYTES)])
    return LiveRouter(loop, router, channel, {"tenant": f"Bearer {tenant.key}", "admin": f"Bearer {admin.key}"},
                      stubs, publisher)


async def _publish_live_state(store: MemoryStore, configs: tuple[RegionConfig, ...]) -> None:
    """What a region's publisher does (every pool healthy and idle), every PUBLISH_INTERVAL_S."""
    while True:
        for config in configs:
            state = RegionLiveState(config.name, True, time.time(), {p.name: PoolLiveState() for p in config.pools})
            await store.set(keys.region_state(config.name), codec.encode_region_state(state), ttl_s=60)
        await asyncio.sleep(PUBLISH_INTERVAL_S)


async def _warm_up(live: LiveRouter) -> None:
    """One answered call per method, so the baseline RSS includes what any first call loads."""
    request = GenerateRequest(model="llama-3.1-8b", prompt="Hello", sampling=SamplingParams(max_tokens=4))
    raw = request.SerializeToString()
    for outcome in (await live.unary(ROUTE, raw, "tenant"), await live.stream(GENERATE, raw, "tenant", 1_000),
                    await live.unary(LIST_REGIONS, b"", "tenant"), await live.unary(GET_STATUS, b"", "admin")):
        assert outcome.code == grpc.StatusCode.OK, (outcome.method, outcome.code, outcome.details)
    for stub in live.stubs:
        stub.log.bodies.clear()


async def _stop(live: LiveRouter) -> None:
    live.publisher.cancel()
    await live.channel.close()
    await live.router.stop(grace_s=0.5)
    for stub in live.stubs:
        await stub.stop()


@pytest.fixture(scope="module")
def live_router() -> Iterator[LiveRouter]:
    """One router for every fuzz case of the module; at teardown the suite's counts and the
    process's RSS before and after are reported, and growth of 100 MB or more fails."""
    loop = asyncio.new_event_loop()
    try:
        live = loop.run_until_complete(_start(loop))
        try:
            loop.run_until_complete(asyncio.sleep(2 * PUBLISH_INTERVAL_S))  # the refresher has read it
            loop.run_until_complete(_warm_up(live))
            before = settled_rss_bytes()
            yield live
            unsettled = rss_bytes()
            after = settled_rss_bytes()
            REPORT.extend(live.tally.lines())
            REPORT.append(f"router process RSS (after gc and malloc_trim): before {before / 2**20:.1f} MiB, "
                          f"after {after / 2**20:.1f} MiB, grown {(after - before) / 2**20:+.1f} MiB "
                          f"(before trimming: {unsettled / 2**20:.1f} MiB)")
            assert after - before < MAX_RSS_GROWTH_BYTES, REPORT[-1]
        finally:
            loop.run_until_complete(_stop(live))
    finally:
        loop.close()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.write_sep("=", "router fuzz")
        for line in REPORT:
            terminalreporter.write_line(line)
