"""How the providers' real APIs behave beyond their reference pages, reproduced by the local
servers (tests/integration/carbon/carbon_apis.py), and what the clients and the poller do:
the Carbon Aware SDK answering with its data source's region name, WattTime's expired token
as an HTML 403, a forecast the key's plan does not cover, Electricity Maps' current host, and
values dated in the future."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time

import pytest

from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.providers import ProviderOptions, make_provider
from scheduler.datalayer.carbon.store_io import read_forecast, read_signal
from scheduler.datalayer.carbon.zone_poller import PART_NOT_PERMITTED_S, RETRY_FAILED_S, LockTiming, ZonePoller
from scheduler.state.memory_store import MemoryStore
from tests.integration.carbon.carbon_apis import CasdkApi, ElectricityMapsApi, Reply, WattTimeApi, iso

pytestmark = pytest.mark.integration

EM_KEY = {"ELECTRICITYMAPS_API_KEY": "em-secret"}
WT_CREDS = {"WATTTIME_USERNAME": "alice", "WATTTIME_PASSWORD": "s3cret"}


def hour_ago() -> float:
    now = time.time()
    return now - now % 3600.0


# --- Carbon Aware SDK backed by WattTime --------------------------------------------------

async def test_casdk_answer_named_by_the_data_source_region_is_accepted_and_recorded(serve, options):
    now = time.time()
    server = serve(CasdkApi(now=now, ratings={"westus": 420.0}, region="CAISO_NORTH"))
    provider = make_provider("casdk", options(server))
    fetched = await provider.fetch("westus")
    await provider.aclose()
    assert fetched.failures == ()
    (latest,) = fetched.latest
    # Keyed by the location asked for; the SDK's region name is kept in the source.
    assert (latest.key, latest.value, latest.source) == ("westus", 420.0, "casdk:/emissions/bylocation@CAISO_NORTH")
    assert len(fetched.forecast) == 12
    assert all(s.key == "westus" and s.source.endswith("@CAISO_NORTH") for s in fetched.forecast)


async def test_casdk_answer_for_the_location_asked_for_has_no_region_suffix(serve, options):
    server = serve(CasdkApi(now=time.time(), ratings={"eastus": 420.0}))
    provider = make_provider("casdk", options(server))
    fetched = await provider.fetch("eastus")
    await provider.aclose()
    assert fetched.latest[0].source == "casdk:/emissions/bylocation"


async def test_casdk_answer_naming_several_locations_is_refused(serve, options):
    now = time.time()
    server = serve(CasdkApi(now=now, ratings={"westus": 420.0}))
    mixed = [{"location": name, "time": iso(now - 300, "%Y-%m-%dT%H:%M:%S+00:00"), "rating": 400.0,
              "duration": "00:05:00"} for name in ("CAISO_NORTH", "BPA")]
    server.push(Reply(200, mixed))
    provider = make_provider("casdk", options(server))
    fetched = await provider.fetch("westus")
    await provider.aclose()
    assert fetched.latest == ()
    assert [(f.reason, f.part) for f in fetched.failures] == [("unknown_zone", "latest")]
    assert "['BPA', 'CAISO_NORTH']" in fetched.failures[0].detail


# --- WattTime: an expired token as a non-JSON 403 -------------------------------------------

async def test_watttime_expired_token_as_html_403_logs_in_again_once(serve, options):
    api = WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time())
    server = serve(api)
    provider = make_provider("watttime", options(server, WT_CREDS))
    assert (await provider.fetch("CAISO_NORTH")).failures == ()
    api.expire_tokens(html_403=True)
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert fetched.failures == () and len(fetched.latest) == 2
    assert api.logins == 2
    assert server.paths()[3:] == ["/v3/forecast", "/login", "/v3/forecast", "/v3/signal-index"]


async def test_watttime_403_with_a_fresh_token_fails_once_with_a_clear_reason(serve, options):
    """Not the token: the plan does not cover the index. One new login, then a proper failure."""
    api = WattTimeApi("alice", "s3cret", {"CAISO_NORTH": 900.0}, percentile=37.0, now=time.time(),
                      plan_paths={"/v3/forecast"})
    server = serve(api)
    provider = make_provider("watttime", options(server, WT_CREDS))
    assert (await provider.fetch("CAISO_NORTH")).failures  # first poll: index refused with a brand-new token
    fetched = await provider.fetch("CAISO_NORTH")
    await provider.aclose()
    assert [s.kind for s in fetched.latest] == ["carbon_intensity"]
    (failure,) = fetched.failures
    assert (failure.reason, failure.status, failure.part) == ("auth", 403, "index")
    assert "refused again right after a fresh login" in failure.detail and "Invalid scope" in failure.detail
    assert server.paths()[5:] == ["/v3/forecast", "/v3/signal-index", "/login", "/v3/signal-index"]


# --- a partial failure does not change the main poll's cadence -----------------------------

class VirtualTime:
    """A clock and a ``sleep`` for the poller's two loops: time moves to the next wake-up only
    while both loops sleep, so a poll's HTTP round trip (real) takes no virtual time."""

    def __init__(self, t: float, sleepers: int = 2) -> None:
        self.t = t
        self.sleepers = sleepers
        self._waiters: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (self.t + seconds, next(self._seq), future))
        await future

    async def run_until(self, end: float) -> None:
        while self.t < end:
            if len(self._waiters) < self.sleepers:
                await asyncio.sleep(0.001)  # a loop is awake (polling): let it finish
                continue
            wake, _, future = heapq.heappop(self._waiters)
            self.t = max(self.t, wake)
            future.set_result(None)
            await asyncio.sleep(0)


async def run_poller(server, options, hours: float, interval_s: float = 300.0) -> tuple[ZonePoller, Counters]:
    clock = VirtualTime(time.time())
    store, counters = MemoryStore(clock=clock), Counters()
    provider = make_provider("electricitymaps", options(server, EM_KEY))
    poller = ZonePoller(provider, "DE", interval_s, store, "router-1", counters, clock=clock, sleep=clock.sleep,
                        lock=LockTiming(ttl_s=15.0))
    task = asyncio.create_task(poller.run())
    try:
        await clock.run_until(clock.t + hours * 3600.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await provider.aclose()
    return poller, counters


@pytest.mark.timeout(120)
async def test_a_forecast_the_plan_refuses_leaves_the_main_poll_at_its_interval(serve, options):
    api = ElectricityMapsApi("em-secret", {"DE": (300.0, hour_ago())},
                             plan_paths={"/v3/carbon-intensity/latest", "/v3/carbon-intensity/history"})
    server = serve(api)
    poller, counters = await run_poller(server, options, hours=2.0)
    latest = server.paths().count("/v3/carbon-intensity/latest")
    forecast = server.paths().count("/v3/carbon-intensity/forecast")
    print(f"\n2 h at a 300 s interval, forecast refused (403): {latest} latest polls, {forecast} forecast requests")
    # One poll per interval (24 in two hours, the first at once), not one a minute (~120).
    assert 24 <= latest <= 25
    # Asked once, refused, then left out of the polls.
    assert forecast == 1 and poller.skipped_parts() == {"forecast"}
    assert counters.value(metrics.PARTS_LEFT_OUT, part="forecast") == 1
    assert counters.value(metrics.FAILURES, reason="auth") == 1


@pytest.mark.timeout(120)
async def test_a_refused_part_is_asked_for_again_after_its_pause(serve, options):
    api = ElectricityMapsApi("em-secret", {"DE": (300.0, hour_ago())},
                             plan_paths={"/v3/carbon-intensity/latest"})
    server = serve(api)
    hours = PART_NOT_PERMITTED_S / 3600.0 + 1.0
    _, counters = await run_poller(server, options, hours=hours, interval_s=900.0)
    assert server.paths().count("/v3/carbon-intensity/forecast") == 2
    assert counters.value(metrics.PARTS_LEFT_OUT, part="forecast") == 2


async def test_the_main_part_failing_retries_soon_and_a_refused_key_waits_the_interval(serve, options):
    at = hour_ago()
    server = serve(ElectricityMapsApi("em-secret", {"DE": (300.0, at)}))
    poller = ZonePoller(make_provider("electricitymaps", options(server, EM_KEY)), "DE", 300.0, MemoryStore(), "a")
    poller.held = True
    server.push(*[Reply(503, "Service Unavailable")] * 3)  # every retry of the latest
    assert not await poller.poll_once()
    assert poller.next_poll_in_s(False) == RETRY_FAILED_S
    # The key refused on every endpoint (403 on the main part too): no part is left out, and
    # retrying within a minute cannot help.
    server.push(Reply(403, "Access denied"), Reply(403, "Access denied"))
    assert not await poller.poll_once()
    assert poller.next_poll_in_s(False) == 300.0 and poller.skipped_parts() == frozenset()
    assert await poller.poll_once() and poller.next_poll_in_s(True) == 300.0
    await poller.provider.aclose()


# --- Electricity Maps' current host ---------------------------------------------------------

async def test_electricitymaps_default_host_is_the_documented_one():
    provider = make_provider("electricitymaps", ProviderOptions(env={}))
    overridden = make_provider("electricitymaps", ProviderOptions(env={"ELECTRICITYMAPS_URL": "http://127.0.0.1:9"}))
    try:
        assert str(provider.http.client.base_url) == "https://api.electricitymaps.com"  # type: ignore[attr-defined]
        assert str(overridden.http.client.base_url) == "http://127.0.0.1:9"  # type: ignore[attr-defined]
    finally:
        await provider.aclose()
        await overridden.aclose()


# --- a value dated in the future is not stored ------------------------------------------------

async def test_a_future_dated_latest_value_is_rejected_and_the_old_one_ages(serve, options):
    at = hour_ago()
    api = ElectricityMapsApi("em-secret", {"DE": (300.0, at)})
    server = serve(api)
    store, counters = MemoryStore(), Counters()
    poller = ZonePoller(make_provider("electricitymaps", options(server, EM_KEY)), "DE", 300.0, store, "a", counters)
    poller.held = True
    assert await poller.poll_once()
    api.values["DE"] = (280.0, at + 2 * 3600.0)  # a provider clock or time-zone slip
    assert not await poller.poll_once()
    stored = await read_signal(store, "DE")
    assert stored is not None and (stored.value, stored.observed_at) == (300.0, at)
    assert counters.value(metrics.REJECTED, provider="electricitymaps", zone="DE", part="latest",
                          reason="future") == 1
    assert len(await read_forecast(store, "DE")) == 24  # forecast points are dated ahead by nature
    await poller.provider.aclose()
