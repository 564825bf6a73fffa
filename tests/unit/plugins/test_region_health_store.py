"""``region_verdict`` beyond a fresh live state: a store outage is not a region outage, and
neither is a store that refuses writes (the router's own probes decide whenever a region's
state is not fresh), a region whose state key expired is stale (its last-seen record), and
never-seen regions are trusted only during the warm-up or while their probe answers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from scheduler.framework.scheduler import STATE_STORE, Scheduler
from scheduler.plugins.health import region_verdict
from scheduler.types import FleetSnapshot, PoolLiveState, ProbeResult, RegionLiveState, Request, StoreStatus
from tests.conftest import SnapshotFactory
from tests.literals import NOW, region

UP = StoreStatus(reachable=True, last_read_at=NOW, since=NOW - 3600)


def down_for(seconds: float) -> StoreStatus:
    return StoreStatus(reachable=False, last_read_at=NOW - seconds, since=NOW - 3600, error="connection refused")


def back_for(seconds: float) -> StoreStatus:
    """Answering again, ``seconds`` after a 60 s outage ended."""
    return StoreStatus(reachable=True, last_read_at=NOW, since=NOW - 3600, recovered_at=NOW - seconds)


def live(*, healthy: bool = True, age_s: float = 0.0) -> RegionLiveState:
    return RegionLiveState(region="a", healthy=healthy, observed_at=NOW - age_s, pools={"h100": PoolLiveState()})


def probe(ok: bool, age_s: float = 0.5) -> ProbeResult:
    return ProbeResult(ok, NOW - age_s, "" if ok else "ConnectError: connection refused")


@dataclass
class Case:
    name: str
    up: bool  # expected: region "a" may take requests
    reason: str = ""  # a fragment of the reason when not
    live: RegionLiveState | None = None
    store: StoreStatus | None = UP
    probes: Mapping[str, ProbeResult] = field(default_factory=dict)
    last_seen: Mapping[str, float] = field(default_factory=dict)
    # seconds since the router started (None: no router, e.g. the simulator)
    uptime_s: float | None = 3600.0


CASES = [
    # The store answers and the state is fresh: the published state decides.
    Case("fresh and healthy", True, live=live()),
    Case("fresh and healthy, probe failing, store up: the state decides", True, live=live(),
         probes={"a": probe(False)}),
    # The store answers reads but the region's state is stale: it cannot publish (a full store,
    # a read-only replica after a failover, its ACL user refused). The router's probe decides.
    Case("stale, store up, probe answers: up (the region cannot publish)", True, live=live(age_s=60),
         probes={"a": probe(True)}),
    Case("stale, store up, probe fails: down", False, "old > limit 5.0 s; the router's probe failed",
         live=live(age_s=60), probes={"a": probe(False)}),
    Case("stale, store up, no probe: the state's age decides", False, "old > limit", live=live(age_s=60)),
    Case("stale, store up, probe itself stale: the state's age decides", False, "old > limit",
         live=live(age_s=60), probes={"a": probe(True, age_s=30)}),
    Case("stale and last known unhealthy, store up, probe answers: down", False, "old > limit",
         live=live(healthy=False, age_s=60), probes={"a": probe(True)}),
    Case("state key expired, store up, probe answers: up", True, last_seen={"a": NOW - 600},
         probes={"a": probe(True)}),
    Case("never seen, warm-up over, store up, probe answers: up (its /health needs a live engine)", True,
         probes={"a": probe(True)}, uptime_s=31.0),
    Case("never seen, warm-up over, store up, probe fails: down", False, "probe failed",
         probes={"a": probe(False)}, uptime_s=31.0),
    Case("never seen, in the warm-up, store up, probe fails: trusted (a probe only rescues here)", True,
         probes={"a": probe(False)}, uptime_s=10.0),
    # The store is unreachable: last known state + the router's own probe.
    Case("store down 60 s, last known healthy (stale), probe answers: up", True, live=live(age_s=60),
         store=down_for(60), probes={"a": probe(True)}),
    Case("store down, last known healthy, probe fails: down", False, "probe failed", live=live(age_s=60),
         store=down_for(60), probes={"a": probe(False)}),
    Case("store down, state still fresh, probe fails: down", False, "probe failed", live=live(age_s=1),
         store=down_for(1), probes={"a": probe(False)}),
    Case("store down, last known unhealthy, probe answers: still down", False, "unhealthy",
         live=live(healthy=False, age_s=2), store=down_for(2), probes={"a": probe(True)}),
    Case("store down, last known unhealthy and stale, probe answers: down", False, "old > limit",
         live=live(healthy=False, age_s=60), store=down_for(60), probes={"a": probe(True)}),
    Case("store down, probe itself stale: the state's age decides", False, "old > limit", live=live(age_s=60),
         store=down_for(60), probes={"a": probe(True, age_s=30)}),
    Case("store down, no probe: the state's age decides", False, "old > limit", live=live(age_s=60),
         store=down_for(60)),
    Case("store down, never seen, after warm-up: down even if the probe answers", False, "no live state seen",
         store=down_for(60), probes={"a": probe(True)}),
    # The store answers again: a region that has not published since may still be reconnecting.
    Case("store back 1 s, no state since (held one 61 s old), probe answers: up", True, live=live(age_s=61),
         store=back_for(1), probes={"a": probe(True)}),
    Case("store back 1 s, no state since, probe fails: down", False, "since the store answered again 1.0 s ago",
         live=live(age_s=61), store=back_for(1), probes={"a": probe(False)}),
    Case("store back 1 s, no state since, no probe: the state's age decides", False, "old > limit",
         live=live(age_s=61), store=back_for(1)),
    Case("store back 6 s (over max_age 5 s), still no state, probe answers: up, as any stale region", True,
         live=live(age_s=66), store=back_for(6), probes={"a": probe(True)}),
    Case("store back 6 s, still no state, no probe: the state's age decides", False, "old > limit",
         live=live(age_s=66), store=back_for(6)),
    Case("store back 3 s, region published since, probe failing: its fresh state decides", True,
         live=live(age_s=1), store=back_for(3), probes={"a": probe(False)}),
    Case("store back 1 s, last known unhealthy, probe answers: still down", False, "unhealthy",
         live=live(healthy=False, age_s=2), store=back_for(1), probes={"a": probe(True)}),
    # Seen, then stopped: the state key expired, the last-seen record remains.
    Case("state key expired, last-seen record present: stale, down", False, "last seen 600.0 s ago",
         last_seen={"a": NOW - 600}),
    Case("state key expired, last-seen record present, in warm-up: still down", False, "last seen",
         last_seen={"a": NOW - 600}, uptime_s=1.0),
    # Never seen.
    Case("never seen, router in its warm-up: trusted", True, uptime_s=10.0),
    Case("never seen, warm-up over: down", False, "no live state seen in the 31 s", uptime_s=31.0),
    Case("never seen, no router (simulator, offline explain): trusted", True, uptime_s=None),
]


def snapshot_of(case: Case, make_snapshot: SnapshotFactory) -> FleetSnapshot:
    snapshot = make_snapshot([region("a")], live=[case.live] if case.live else [])
    return dataclasses.replace(
        snapshot, store=case.store, probes=dict(case.probes), last_seen=dict(case.last_seen),
        live_since=None if case.uptime_s is None else NOW - case.uptime_s,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_region_verdict(case: Case, make_snapshot: SnapshotFactory) -> None:
    snapshot = snapshot_of(case, make_snapshot)
    assert snapshot.policy.unknown_region_state.missing_warmup == 30.0  # the shipped default policy
    verdict = region_verdict(snapshot, "a")
    assert (verdict is None) == case.up, verdict
    if verdict is not None:
        fmt, args = verdict
        assert case.reason in fmt.format(*args)


REQUEST = Request(request_id="r", model="llama-3.1-8b", prompt_tokens=500, max_tokens=100)


def test_decision_says_it_runs_without_the_store(make_snapshot: SnapshotFactory, scheduler: Scheduler) -> None:
    outage = Case("", True, live=live(age_s=90), store=down_for(90), probes={"a": probe(True)})
    decision = scheduler.schedule(REQUEST, snapshot_of(outage, make_snapshot))
    assert decision.schedulable
    store = [f for f in decision.fallbacks if f.signal == STATE_STORE]
    assert len(store) == 1, decision.fallbacks
    assert store[0].age_s == pytest.approx(90.0)
    assert "running without the state store for 90 s" in store[0].detail
    assert "probes" in store[0].detail

    # Nothing schedulable during the outage: the decision still says why the regions were judged so.
    failing = dataclasses.replace(outage, probes={"a": probe(False)})
    empty = scheduler.schedule(REQUEST, snapshot_of(failing, make_snapshot))
    assert not empty.schedulable
    assert [f.signal for f in empty.fallbacks] == [STATE_STORE]

    healthy = Case("", True, live=live())
    assert all(f.signal != STATE_STORE for f in scheduler.schedule(REQUEST, snapshot_of(healthy, make_snapshot)).fallbacks)
