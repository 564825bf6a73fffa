"""Whether a region may take requests: its last published live state, its last-seen record
and, whenever that state is not fresh, the router's own probe of it (the region-health filter
spreads the verdicts to the candidates, scheduler.plugins.filters.region_health; the router's
status reports count them).

While the store answers (or there is none: simulator, offline tools):
  keep  iff  live[region] is fresh (age <= policy.max_age.region_state) and healthy,
        or   it is stale and policy.unknown_region_state.stale == "assume-healthy",
        or   its state key expired but its last-seen record (30 days) is there: stale, as above,
        or   it was never seen and the router started at most unknown_region_state.missing_warmup
             ago (or the snapshot has no router: live_since None),
        or   it was never seen and unknown_region_state.missing == "assume-healthy".
While the store is unreachable (snapshot.store_outage_s not None), and for max_age.region_state
after it answers again (store.recovered_at) for a region that has not published since (its
publisher may still be reconnecting), if the region has a probe no older than
max_age.region_state:
  drop  if   the probe failed (whatever the last known state says);
  keep  if   the probe answered and the last known state said healthy (however old it is);
  else       as above.
While the store answers but the region's own state is not fresh (stale, expired or never seen:
the region cannot publish, as when the store is full, read-only after a failover, or refuses
its ACL user, while routers can still read) and that state would drop the region, a fresh probe
that answers keeps it (if its last known state was healthy, or it was never seen: its /health
answers 200 only while one of its pools' engines answers). Here a probe only rescues: a
failing one never drops a region its state keeps. A store that refuses writes is then not a
fleet outage.
Reads: snapshot.live (observed_at, healthy), snapshot.last_seen, snapshot.probes,
snapshot.store, snapshot.live_since, snapshot.now, policy.max_age.region_state,
policy.unknown_region_state.
"""

from __future__ import annotations

from scheduler.types import FleetSnapshot, RegionLiveState

# None (may take requests) or why not: a format string and its arguments
Verdict = tuple[str, tuple[object, ...]] | None


def store_steady(snapshot: FleetSnapshot) -> bool:
    """The store answers (or there is none) and did not recover from an outage within
    ``max_age.region_state``: a region's own state is then all its verdict needs when fresh."""
    store = snapshot.store
    return snapshot.store_outage_s is None and not (
        store is not None and store.reachable and store.recovered_at is not None
        and snapshot.now - store.recovered_at <= snapshot.policy.max_age.region_state)


def region_verdicts(snapshot: FleetSnapshot) -> list[Verdict]:
    """``region_verdict`` of every region (``snapshot.regions`` order), with what they share
    looked up once: while the store answers and no recovery is recent, a region whose state is
    fresh and healthy may take requests, and any other is judged by ``region_verdict``."""
    if not store_steady(snapshot):
        return [region_verdict(snapshot, r.name) for r in snapshot.regions]
    now = snapshot.now
    max_age = snapshot.policy.max_age.region_state
    get = snapshot.live.get
    return [None if (state := get(r.name)) is not None and state.healthy and now - state.observed_at <= max_age
            else region_verdict(snapshot, r.name) for r in snapshot.regions]


def region_verdict(snapshot: FleetSnapshot, region: str) -> Verdict:
    """None when ``region`` may take requests, else why not."""
    policy = snapshot.policy
    max_age = policy.max_age.region_state
    state = snapshot.live.get(region)
    outage_s = snapshot.store_outage_s
    back_s = _back_without_news(snapshot, state, max_age)
    if outage_s is not None or back_s is not None:
        probe = snapshot.probes.get(region)
        if probe is not None and snapshot.now - probe.checked_at <= max_age:
            if not probe.ok:
                if outage_s is not None:
                    return ("state store unreachable for {:.0f} s and the router's probe failed: {}",
                            (outage_s, probe.detail))
                return ("no state since the store answered again {:.1f} s ago and the router's probe failed: {}",
                        (back_s, probe.detail))
            if state is not None and state.healthy:
                return None
        return _by_state(snapshot, region)
    by_state = _by_state(snapshot, region)
    if by_state is None or (state is not None and snapshot.now - state.observed_at <= max_age):
        return by_state
    # The store answers, but the region's state is not fresh and would drop it: its probe may
    # still vouch for it (the region cannot publish). A probe only rescues here, so a slow
    # probe never drops a region its state keeps (a never-seen one in the warm-up).
    probe = snapshot.probes.get(region)
    if probe is None or snapshot.now - probe.checked_at > max_age:
        return by_state
    if not probe.ok:
        return (by_state[0] + "; the router's probe failed: {}", (*by_state[1], probe.detail))
    return None if state is None or state.healthy else by_state


def _back_without_news(snapshot: FleetSnapshot, state: RegionLiveState | None, max_age: float) -> float | None:
    """Seconds since the store answered again after an outage, while that is at most
    ``max_age`` ago and the region has published nothing since; else None."""
    store = snapshot.store
    if store is None or not store.reachable or store.recovered_at is None:
        return None
    back_s = snapshot.now - store.recovered_at
    if back_s > max_age or (state is not None and state.observed_at >= store.recovered_at):
        return None
    return back_s


def _by_state(snapshot: FleetSnapshot, region: str) -> Verdict:
    """The verdict from the region's published state and last-seen record alone."""
    policy = snapshot.policy
    unknown = policy.unknown_region_state
    max_age = policy.max_age.region_state
    state = snapshot.live.get(region)
    if state is None:
        seen = snapshot.last_seen.get(region)
        if seen is not None:
            age = snapshot.now - seen
            if unknown.stale == "assume-healthy":
                return None
            return ("no live state (its key expired); last seen {:.1f} s ago, limit {:.1f} s", (age, max_age))
        if snapshot.live_since is None or snapshot.now - snapshot.live_since <= unknown.missing_warmup:
            return None
        if unknown.missing == "assume-healthy":
            return None
        return ("no live state seen in the {:.0f} s since the router started (warm-up {:.0f} s)",
                (snapshot.now - snapshot.live_since, unknown.missing_warmup))
    age = snapshot.now - state.observed_at
    if age > max_age:
        return None if unknown.stale == "assume-healthy" else ("live state {:.1f} s old > limit {:.1f} s", (age, max_age))
    return None if state.healthy else ("region reports unhealthy", ())
