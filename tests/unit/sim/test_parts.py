"""The simulator's parts: carbon replay and workload generation (replicas, pools and the truth
model: test_replica.py, test_pools.py)."""

from __future__ import annotations

from collections import Counter

import pytest

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.sim.carbon_feed import CarbonReplay, ProviderOutage
from scheduler.sim.workload import DEFAULT_CONTINENTS, RequestFactory, WorkloadConfig, build_workload, load_trace
from scheduler.types import WORKLOAD_CLASSES, GeoPoint, Request
from tests.unit.sim.kit import START, Files, write_zone

T0 = START.timestamp()
HOUR = 3600.0


@pytest.mark.parametrize(
    ("name", "delay_s", "outages", "at", "observed"),
    [
        ("current hour, no delay", 0.0, (), T0 + 1.5 * HOUR, T0 + HOUR),
        ("15 min delay, before it is out", 900.0, (), T0 + HOUR + 600, T0),
        ("15 min delay, after it is out", 900.0, (), T0 + HOUR + 1000, T0 + HOUR),
        ("outage keeps the last value published before it", 0.0,
         (ProviderOutage(None, T0 + 2 * HOUR, T0 + 9 * HOUR),), T0 + 5 * HOUR, T0 + HOUR),
        ("outage from the instant it starts", 0.0, (ProviderOutage(None, T0 + 2 * HOUR, T0 + 9 * HOUR),),
         T0 + 2 * HOUR, T0 + HOUR),
        ("outage with a delay: the last value out before it", 900.0,
         (ProviderOutage(None, T0 + 2 * HOUR + 600, T0 + 9 * HOUR),), T0 + 5 * HOUR, T0 + HOUR),
        ("outage of another zone", 0.0, (ProviderOutage("DIRTY", T0, T0 + 9 * HOUR),), T0 + 5 * HOUR, T0 + 5 * HOUR),
        ("after the outage", 0.0, (ProviderOutage(None, T0, T0 + 3 * HOUR),), T0 + 4.2 * HOUR, T0 + 4 * HOUR),
    ],
)
def test_carbon_replay_publishes_what_the_provider_had(
    files: Files, name: str, delay_s: float, outages: tuple[ProviderOutage, ...], at: float, observed: float
) -> None:
    replay = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN"], 2023, delay_s, outages)
    signal = replay.published(at)["CLEAN"]
    assert signal.observed_at == observed, name
    assert signal.value == 20.0
    # accounting always uses the true current value
    assert replay.intensity("CLEAN", at) == 20.0


def test_one_replay_asked_along_the_timeline_answers_as_fresh_ones(files: Files) -> None:
    # The replay answers from its last result until the next row or outage boundary: asked
    # every 7 minutes over 12 hours with a delay and two outages, it must agree with a new
    # replay asked once at each time.
    outages = (ProviderOutage("CLEAN", T0 + 2 * HOUR, T0 + 5 * HOUR), ProviderOutage(None, T0 + 7.5 * HOUR, T0 + 8 * HOUR))
    kept = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN", "DIRTY"], 2023, 900.0, outages)
    for step in range(0, 12 * 60, 7):
        at = T0 + step * 60.0
        fresh = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN", "DIRTY"], 2023, 900.0, outages)
        expected = {zone: s.observed_at for zone, s in fresh.published(at).items()}
        assert {zone: s.observed_at for zone, s in kept.published(at).items()} == expected, step


def test_during_an_outage_the_zone_keeps_its_pre_outage_hour_and_is_fresh_after_it(files: Files) -> None:
    # CLEAN's feed is quiet 06:00-12:00 (``--carbon-outage CLEAN@+6h+6h``): every 10 minutes
    # from 00:00 to 15:00, its signal is the current hour's before and after the outage and
    # 05:00's during it (observed_at true, so its age grows to 7 h); DIRTY's is always current.
    replay = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN", "DIRTY"], 2023,
                                   outages=(ProviderOutage("CLEAN", T0 + 6 * HOUR, T0 + 12 * HOUR),))
    for minute in range(0, 15 * 60 + 1, 10):
        at = T0 + minute * 60.0
        hour = T0 + (minute // 60) * HOUR
        published = replay.published(at)
        quiet = T0 + 6 * HOUR <= at < T0 + 12 * HOUR
        assert published["CLEAN"].observed_at == (T0 + 5 * HOUR if quiet else hour), minute
        assert published["DIRTY"].observed_at == hour, minute
    assert replay.quiet_since("CLEAN", T0 + 7 * HOUR) == T0 + 6 * HOUR
    assert replay.quiet_since("CLEAN", T0 + 12 * HOUR) is None


def test_overlapping_outages_are_one_quiet_period(files: Files) -> None:
    outages = (ProviderOutage("CLEAN", T0 + 2 * HOUR, T0 + 5 * HOUR), ProviderOutage(None, T0 + 4 * HOUR, T0 + 8 * HOUR))
    replay = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN", "DIRTY"], 2023, outages=outages)
    assert replay.published(T0 + 6 * HOUR)["CLEAN"].observed_at == T0 + HOUR  # quiet since 02:00
    assert replay.published(T0 + 6 * HOUR)["DIRTY"].observed_at == T0 + 3 * HOUR  # quiet since 04:00
    assert replay.published(T0 + 8 * HOUR)["CLEAN"].observed_at == T0 + 8 * HOUR


def test_trailing_max_is_the_highest_accepted_value_received_in_the_window(files: Files) -> None:
    # Hourly values from 00:00; 05:00 is garbage (5,000 g/kWh, past the physical bounds) and
    # is never accepted.
    write_zone(files.carbon_dir, "PEAKY", [100.0, 300.0, 200.0, 150.0, 120.0, 5000.0, 110.0, 400.0, 90.0, 80.0])
    plain = CarbonReplay.from_dir(files.carbon_dir, ["PEAKY"], 2023)
    assert plain.trailing_max("PEAKY", T0 + 2.5 * HOUR, 3 * HOUR) == 300.0  # 00:00-02:00 observed in the window
    assert plain.trailing_max("PEAKY", T0 + 4.5 * HOUR, 3 * HOUR) == 200.0  # 01:30-04:30: 02:00 to 04:00
    assert plain.trailing_max("PEAKY", T0 + 6.0 * HOUR, 2 * HOUR) == 120.0  # 04:00, (05:00 rejected), 06:00
    assert plain.trailing_max("PEAKY", T0 - HOUR, 3 * HOUR) is None  # nothing observed yet
    # Published 30 min after the hour: at 07:10, 07:00's 400 is not out yet.
    late = CarbonReplay.from_dir(files.carbon_dir, ["PEAKY"], 2023, delay_s=1800.0)
    assert late.trailing_max("PEAKY", T0 + 7 * HOUR + 600, 2 * HOUR) == 110.0
    assert late.trailing_max("PEAKY", T0 + 7 * HOUR + 1800, 2 * HOUR) == 400.0
    # Quiet from 06:30: what was published before then only, until the window leaves it behind.
    quiet = CarbonReplay.from_dir(files.carbon_dir, ["PEAKY"], 2023,
                                  outages=(ProviderOutage("PEAKY", T0 + 6.5 * HOUR, T0 + 9 * HOUR),))
    assert quiet.trailing_max("PEAKY", T0 + 8 * HOUR, 3 * HOUR) == 110.0  # 07:00's 400 came during the outage
    assert quiet.trailing_max("PEAKY", T0 + 8 * HOUR, HOUR) is None  # 06:00 is older than the window
    assert quiet.trailing_max("PEAKY", T0 + 9 * HOUR, 3 * HOUR) == 400.0  # fresh again


def test_carbon_replay_has_no_signal_before_the_first_published_value(files: Files) -> None:
    replay = CarbonReplay.from_dir(files.carbon_dir, ["CLEAN"], 2023, delay_s=HOUR)
    assert "CLEAN" not in replay.published(T0 + 0.5 * HOUR)


def test_workload_tiles_the_trace_to_the_rate_and_duration(files: Files) -> None:
    trace = load_trace(str(files.trace))
    assert trace.native_rate == pytest.approx(1.0)
    config = WorkloadConfig(start=T0, hours=0.5, rate=4.0)
    workload = build_workload(trace, config, seed=1)
    assert len(workload) == 7200
    assert workload.arrival_s == sorted(workload.arrival_s)
    assert workload.arrival_s[0] == T0
    # trace gaps of 1 s at 4 req/s become 0.25 s
    assert workload.arrival_s[1] - workload.arrival_s[0] == pytest.approx(0.25)
    assert workload.arrival_s[-1] < T0 + 1800


def test_workload_residency_only_for_clients_in_a_jurisdiction_and_at_its_share() -> None:
    workload = build_workload(load_trace("conv"), WorkloadConfig(start=T0, hours=1.0, rate=20.0), seed=3)
    europe = {i for i, j in enumerate(workload.city_jurisdiction) if j == "EU"}
    eu_rows = [k for k, city in enumerate(workload.city) if city in europe]
    assert all(workload.city[k] in europe for k, r in enumerate(workload.restricted) if r)
    share = sum(workload.restricted[k] for k in eu_rows) / len(eu_rows)
    assert share == pytest.approx(0.4, abs=0.03)
    expected_eu = next(c.share for c in DEFAULT_CONTINENTS if c.name == "europe")
    assert len(eu_rows) / len(workload) == pytest.approx(expected_eu / sum(c.share for c in DEFAULT_CONTINENTS), abs=0.01)
    requests = RequestFactory(workload)
    first_restricted = workload.restricted.index(True)
    assert requests.request(first_restricted).allowed_jurisdictions == frozenset({"EU"})


def test_workload_classes_and_prefix_keys_follow_their_shares() -> None:
    config = WorkloadConfig(start=T0, hours=1.0, rate=10.0, batch_share=0.2, deferrable_share=0.1, prefix_share=0.5)
    workload = build_workload(load_trace("code"), config, seed=5)
    requests = RequestFactory(workload)
    classes = Counter(requests.request(i).workload_class for i in range(len(workload)))
    n = len(workload)
    assert classes["deferrable"] / n == pytest.approx(0.1, abs=0.02)
    assert classes["batch"] / n == pytest.approx(0.2, abs=0.02)
    with_prefix = [i for i in range(n) if workload.prefix_group[i] >= 0]
    assert len(with_prefix) / n == pytest.approx(0.5, abs=0.03)
    assert all(0 < workload.prefix_tokens[i] < workload.prompt_tokens[i] for i in with_prefix)


def test_factory_requests_equal_the_constructors() -> None:
    """The factory sets a request's slots itself: the same request as ``Request(...)``."""
    config = WorkloadConfig(start=T0, hours=0.2, rate=10.0, batch_share=0.2, deferrable_share=0.1, prefix_share=0.5)
    workload = build_workload(load_trace("conv"), config, seed=2)
    requests = RequestFactory(workload)
    for i in range(len(workload)):
        city = workload.city[i]
        group = workload.prefix_group[i]
        jurisdiction = workload.city_jurisdiction[city]
        expected = Request(
            request_id=f"sim-{i}", model=workload.model, prompt_tokens=workload.prompt_tokens[i],
            max_tokens=workload.output_tokens[i], workload_class=WORKLOAD_CLASSES[workload.workload_class[i]],
            allowed_jurisdictions=frozenset({jurisdiction}) if workload.restricted[i] else frozenset(),
            client_location=GeoPoint(workload.cities[city].lat, workload.cities[city].lon),
            prefix_key=f"prefix-{group}" if group >= 0 else None,
        )
        assert requests.request(i) == expected


def test_the_sim_prices_a_stale_zone_at_its_trailing_maximum(files: Files) -> None:
    """The simulator's snapshots carry what a router's data layer keeps (docs/objective.md):
    during CLEAN's outage, once its last value is older than the policy's 2 h, CLEAN gets its
    highest accepted value of the window as its bound; a fresh zone gets none."""
    from scheduler.datalayer.snapshot import SnapshotBuilder
    from scheduler.sim.datalayer import SimDataLayer
    from tests.unit.sim import kit

    write_zone(files.carbon_dir, "SWINGY", [50.0, 250.0, 60.0, 55.0] + [58.0] * 20)
    regions = (kit.region("north", "SWINGY", kit.OSLO), kit.region("paris", "DIRTY", kit.PARIS))
    builder = SnapshotBuilder(compile_fleet(regions), compile_policy(kit.policy()))
    replay = CarbonReplay.from_dir(files.carbon_dir, ["SWINGY", "DIRTY"], 2023,
                                   outages=(ProviderOutage("SWINGY", T0 + 6 * HOUR, T0 + 12 * HOUR),))
    data = SimDataLayer(builder, replay, {}, refresh_s=0.0)
    assert data.snapshot(T0 + 7 * HOUR).carbon_bounds == {}  # 05:00's value, 2 h old: still usable
    stale = data.snapshot(T0 + 9 * HOUR)
    assert stale.carbon["SWINGY"].observed_at == T0 + 5 * HOUR
    assert stale.carbon_bounds == {"SWINGY": 250.0}  # 01:00's peak, within the policy's week
    assert data.snapshot(T0 + 13 * HOUR).carbon_bounds == {}  # fresh again
