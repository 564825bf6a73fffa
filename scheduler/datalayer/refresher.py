"""``SnapshotRefresher``: rebuilds the router's ``FleetSnapshot`` from the store in the background.

Every ``interval_s`` it reads, in one ``mget``, each configured region's live state, the
carbon-intensity signal of each region's ``carbon.zone`` and the flags (kill switch), and
builds a new immutable snapshot with ``now = clock()``. The request path only calls
``current()``, which does no I/O, and ``record_dispatch`` after each decision: the work this
router sent since a region last published counts in later decisions (no herding between two
refreshes; scheduler.datalayer.pending). When the store is down (or a record is malformed) the last
good inputs are kept and the snapshot is still rebuilt with the new ``now``, so their age
grows and the policy's max-age limits make them stale in the open (never silently fresh).
With a ``canary`` hook (scheduler.canary.runtime) each refresh also reads the policy's canary
(whether its arm is on, its windows; a crossed bound rolls it back) and each snapshot carries it,
so an arm rolled back on any router is off on this one within ``interval_s``.

A store outage is not a region outage: each snapshot also carries the store's status
(``StoreStatus``: reachable, last good read), the router's own probes of each region's
endpoint (``RegionProbes``, started and stopped with the refresher when given) and the router's
start (``live_since``). While the store is unreachable, the region-health filter judges a
region by its last known state plus its probe, not by the age of that state alone. The
refresher also reads each region's last-seen record (``keys.region_seen``, kept 30 days, written by
the region's publisher), so a region whose state key expired counts as stale, not never seen.

Affinity (docs/affinity.md): each refresh also reads every region's prefix-warm record
(``keys.prefix_warm``: the prefix keys its pools served with prefix-cache hits) and each
snapshot carries them as ``prefix_warm``, only those younger than the policy's
``max_age.prefix_cache`` and at most ``MAX_WARM_KEYS`` keys (the most recent). The router
also keeps, from its own dispatches, where each workflow id last ran (``workflows``, at most
``MAX_WORKFLOWS``, the same age limit). A dispatch's workflow home is visible to the very next
``current()``, not only from the next refresh: a fan-out's siblings sent within one refresh
interval follow the first one to its pool (the affinity scorer), the pending tracker counting
their work there, so the SLO filter sends a sibling elsewhere once the home cannot meet its
deadline.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import time
from collections import ChainMap, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from scheduler.datalayer.carbon.store_io import decode_daily_max, window_max
from scheduler.datalayer.pending import PendingDispatches
from scheduler.datalayer.probes import RegionProbes
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.policy import Policy
from scheduler.state import codec, keys, prefix_warm
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.types import Candidate, FleetSnapshot, RegionLiveState, Request, Signal, StoreStatus, WarmPrefix

log = logging.getLogger(__name__)

T = TypeVar("T")

CARBON_KIND = "carbon_intensity"
# Bounds of what a snapshot carries for affinity (the most recent are kept).
MAX_WARM_KEYS = 4096
MAX_WORKFLOWS = 10_000


def parse_flags(raw: bytes) -> bool:
    """``energy_routing`` from the flags record; ValueError when the record is malformed."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"flags record is not JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("energy_routing", True), bool):
        raise ValueError(f"flags record must be an object with a boolean energy_routing, got {data!r}")
    enabled: bool = data.get("energy_routing", True)
    return enabled


def encode_seen(observed_at: float) -> bytes:
    """The last-seen record: the epoch seconds of the region's last published state."""
    return f"{observed_at:.3f}".encode()


def decode_seen(raw: bytes) -> float:
    """ValueError when the record is not a finite number of epoch seconds."""
    try:
        seen = float(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"last-seen record must be epoch seconds, got {raw[:40]!r}") from None
    if not math.isfinite(seen):
        raise ValueError(f"last-seen record must be finite, got {seen}")
    return seen


@dataclass
class RefresherStatus:
    """What the last refresh saw, for ``GetStatus`` and health."""

    last_attempt_at: float | None = None
    last_success_at: float | None = None
    last_error: str = ""
    refreshes: int = 0
    failures: int = 0
    # The first good read after failed ones.
    recovered_at: float | None = None

    @property
    def reachable(self) -> bool:
        """The last read succeeded (False before the first one)."""
        return self.last_error == "" and self.last_success_at is not None


class SnapshotHook(Protocol):
    """Reads more of the store with each refresh and puts it into each snapshot built (the
    policy's canary: ``scheduler.canary.runtime.CanaryRuntime``)."""

    async def refresh(self, policy: Policy) -> None: ...

    def attach(self, snapshot: FleetSnapshot) -> FleetSnapshot: ...


@dataclass
class SnapshotRefresher:
    builder: SnapshotBuilder
    store: StateStore
    clock: Callable[[], float] = time.time
    # Half a second so that a kill switch set on any router holds everywhere within 1 s.
    interval_s: float = 0.5
    # The router's own probes of each region (None: none; routing then has only the store).
    probes: RegionProbes | None = None
    # The policy's canary: its arm's on/off state and windows, read with every refresh (within
    # 0.5 s of a rollback on any router) and carried by each snapshot (None: no canary).
    canary: SnapshotHook | None = None
    status: RefresherStatus = field(default_factory=RefresherStatus, init=False)
    _carbon: dict[str, Signal] = field(default_factory=dict, init=False, repr=False)
    # grid zone -> its daily maxima, as the store last held them
    _daily_max: dict[str, list[tuple[float, float]]] = field(default_factory=dict, init=False, repr=False)
    _live: dict[str, RegionLiveState] = field(default_factory=dict, init=False, repr=False)
    _seen: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _energy_routing: bool = field(default=True, init=False, repr=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _bad_records: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    # region -> its last prefix-warm record's entries; workflow id -> where it last ran.
    _warm: dict[str, list[tuple[str, WarmPrefix]]] = field(default_factory=dict, init=False, repr=False)
    _workflows: OrderedDict[str, WarmPrefix] = field(default_factory=OrderedDict, init=False, repr=False)
    # Workflow homes recorded since the last build, and the snapshot that shows them (the
    # pending-applied snapshot it was made from, and the result; None: to be made).
    _recent_workflows: dict[str, WarmPrefix] = field(default_factory=dict, init=False, repr=False)
    _with_recent: tuple[FleetSnapshot, FleetSnapshot] | None = field(default=None, init=False, repr=False)
    _built_workflows: dict[str, WarmPrefix] = field(default_factory=dict, init=False, repr=False)
    pending: PendingDispatches = field(default_factory=PendingDispatches, init=False, repr=False)

    def __post_init__(self) -> None:
        self._plan_reads(self.builder)
        # The router's start: never-seen regions are trusted for the policy's warm-up after it.
        self._live_since = self.clock()
        self._snapshot = self._build()

    def _plan_reads(self, builder: SnapshotBuilder) -> None:
        """The store keys a refresh reads for ``builder``'s regions."""
        regions = builder.regions
        self._region_keys = {region.name: keys.region_state(region.name) for region in regions}
        self._seen_keys = {region.name: keys.region_seen(region.name) for region in regions}
        self._warm_keys = {region.name: keys.prefix_warm(region.name) for region in regions}
        # store key of the zone's signal (and of its daily maxima) -> the grid zones the scorer
        # looks it up under
        self._signal_zones: dict[str, list[str]] = {}
        self._max_zones: dict[str, list[str]] = {}
        for region in regions:
            grid_zones = self._signal_zones.setdefault(keys.signal(CARBON_KIND, region.carbon.zone), [])
            if region.grid_zone not in grid_zones:
                grid_zones.append(region.grid_zone)
            self._max_zones[keys.signal_daily_max(CARBON_KIND, region.carbon.zone)] = grid_zones

    async def use_builder(self, builder: SnapshotBuilder) -> FleetSnapshot:
        """Serve snapshots of another config (hot reload, scheduler.server.config_reload): the
        store is read for its regions at once and the first snapshot of it replaces the last
        one in one step, so a request sees the old config or the new one, never a mix. What is
        known of regions and zones that stay is kept; of those that left, dropped."""
        self.builder = builder
        self._plan_reads(builder)
        names = set(self._region_keys)
        grid_zones = {zone for zones in self._signal_zones.values() for zone in zones}
        for known in (self._live, self._seen, self._warm):
            for name in [name for name in known if name not in names]:
                del known[name]
        for known_zones in (self._carbon, self._daily_max):
            for zone in [zone for zone in known_zones if zone not in grid_zones]:
                del known_zones[zone]
        return await self.refresh()

    def current(self) -> FleetSnapshot:
        """The latest snapshot with this router's pending dispatches and the workflow homes
        recorded since it was built (no I/O: safe on the request path)."""
        snapshot = self.pending.apply(self._snapshot)
        if not self._recent_workflows:
            return snapshot
        made = self._with_recent
        if made is None or made[0] is not snapshot:
            # A copy of the recent homes: a snapshot handed out never changes.
            homes = ChainMap(dict(self._recent_workflows), self._built_workflows)
            made = (snapshot, snapshot.with_workflows(homes))
            self._with_recent = made
        return made[1]

    def record_dispatch(self, snapshot: FleetSnapshot, candidate: Candidate, request: Request) -> None:
        """This router sent ``request`` to ``candidate``: later decisions count its work
        until the region's live state shows it (scheduler.datalayer.pending)."""
        now = self.clock()
        self.pending.record(snapshot, candidate, request, now)
        if request.workflow_id:
            home = WarmPrefix(candidate.region.name, candidate.pool.name, request.prompt_tokens, now,
                              source="workflow")
            self._workflows[request.workflow_id] = home
            self._workflows.move_to_end(request.workflow_id)
            while len(self._workflows) > MAX_WORKFLOWS:
                self._workflows.popitem(last=False)
            self._recent_workflows[request.workflow_id] = home
            self._with_recent = None

    @property
    def energy_routing(self) -> bool:
        return self._energy_routing

    async def refresh(self) -> FleetSnapshot:
        """Read the store once and rebuild; on ``StateUnavailable`` keep the last inputs."""
        self.status.last_attempt_at = self.clock()
        planned = self._region_keys
        region_keys = list(self._region_keys.values())
        seen_keys = list(self._seen_keys.values())
        signal_keys = list(self._signal_zones)
        warm_keys = list(self._warm_keys.values())
        max_keys = list(self._max_zones)
        try:
            values = await self.store.mget([*region_keys, *seen_keys, *signal_keys, keys.FLAGS, *warm_keys,
                                            *max_keys])
            if self._region_keys is not planned:
                # The config changed during the read (use_builder): its own refresh reads anew.
                return self._snapshot
        except StateUnavailable as exc:
            self.status.failures += 1
            if self.status.last_error != str(exc):
                log.warning("state store unavailable, keeping the last snapshot inputs (they age): %s", exc)
            self.status.last_error = str(exc)
        else:
            n_regions = len(region_keys)
            self._apply_regions(dict(zip(self._region_keys, values[:n_regions], strict=True)))
            self._apply_seen(dict(zip(self._seen_keys, values[n_regions : 2 * n_regions], strict=True)))
            self.pending.settle(self._live, self.clock())
            n_signals = len(signal_keys)
            self._apply_signals(dict(zip(signal_keys, values[2 * n_regions : 2 * n_regions + n_signals], strict=True)))
            self._apply_flags(values[2 * n_regions + n_signals])
            n_warm = len(warm_keys)
            at = 2 * n_regions + n_signals + 1
            self._apply_warm(dict(zip(self._warm_keys, values[at:at + n_warm], strict=True)))
            self._apply_daily_max(dict(zip(max_keys, values[at + n_warm:], strict=True)))
            if self.status.last_error:
                self.status.recovered_at = self.status.last_attempt_at
                log.warning("state store reachable again")
            self.status.last_success_at = self.status.last_attempt_at
            self.status.last_error = ""
        if self.canary is not None:
            try:
                await self.canary.refresh(self.builder.policy)
            except Exception:
                log.exception("canary refresh failed (its arm stays as it was)")
        self.status.refreshes += 1
        self._snapshot = self._build()
        return self._snapshot

    def _build(self) -> FleetSnapshot:
        now = self.clock()
        snapshot = self.builder.build(
            now=now,
            carbon=dict(self._carbon),
            live=dict(self._live),
            energy_routing_enabled=self._energy_routing,
            carbon_bounds=self._carbon_bounds(now),
        )
        status = self.status
        built = dataclasses.replace(
            snapshot,
            store=StoreStatus(status.reachable, status.last_success_at, self._live_since, status.last_error,
                              status.recovered_at),
            probes={} if self.probes is None else self.probes.results(),
            last_seen=self._last_seen(),
            live_since=self._live_since,
            prefix_warm=self._fresh_warm(now),
            workflows=self._fresh_workflows(now),
            # The framework keeps plugin columns per live_key: new inputs, a new key.
            live_key=object(),
        )
        # Computed here, once: every dispatch's snapshot is a shallow copy of this one
        # (``with_pending``) and would otherwise compute it again for each request.
        _ = built.candidates_by_model, built.pools
        if self.canary is not None:
            built = self.canary.attach(built)
        return built

    def _last_seen(self) -> dict[str, float]:
        """Per region: the later of its last-seen record and the state we hold."""
        seen = dict(self._seen)
        for region, state in self._live.items():
            seen[region] = max(seen.get(region, state.observed_at), state.observed_at)
        return seen

    def _apply_warm(self, raw_by_region: Mapping[str, bytes | None]) -> None:
        for region, raw in raw_by_region.items():
            if raw is None:
                # Expired (TTL): the region served no hit for a while; nothing of it is warm.
                self._warm.pop(region, None)
                continue
            record = self._decode(self._warm_keys[region], raw, prefix_warm.decode)
            if record is None:
                continue
            if record[0] != region:
                self._note_bad(self._warm_keys[region], f"record of region {record[0]!r}")
                continue
            self._warm[region] = record[1]

    def _fresh_warm(self, now: float) -> dict[str, tuple[WarmPrefix, ...]]:
        """Prefix key -> the pools where it is warm: hits younger than the policy's
        max_age.prefix_cache (a stale one is dropped), the MAX_WARM_KEYS most recent keys."""
        oldest = now - self.builder.policy.max_age.prefix_cache
        by_key: dict[str, list[WarmPrefix]] = {}
        for entries in self._warm.values():
            for key, warm in entries:
                if oldest <= warm.observed_at:
                    by_key.setdefault(key, []).append(warm)
        if len(by_key) > MAX_WARM_KEYS:
            newest = sorted(by_key, key=lambda k: max(w.observed_at for w in by_key[k]), reverse=True)
            by_key = {k: by_key[k] for k in newest[:MAX_WARM_KEYS]}
        return {key: tuple(places) for key, places in by_key.items()}

    def _fresh_workflows(self, now: float) -> dict[str, WarmPrefix]:
        # The built snapshot holds every home recorded so far.
        self._recent_workflows.clear()
        self._with_recent = None
        oldest = now - self.builder.policy.max_age.prefix_cache
        while self._workflows:
            first = next(iter(self._workflows.values()))
            if first.observed_at >= oldest:
                break
            self._workflows.popitem(last=False)
        self._built_workflows = dict(self._workflows)
        return self._built_workflows

    def _apply_seen(self, raw_by_region: Mapping[str, bytes | None]) -> None:
        for region, raw in raw_by_region.items():
            if raw is None:
                continue
            seen = self._decode(self._seen_keys[region], raw, decode_seen)
            if seen is not None:
                self._seen[region] = seen

    def _apply_regions(self, raw_by_region: Mapping[str, bytes | None]) -> None:
        for region, raw in raw_by_region.items():
            if raw is None:
                # Expired (TTL): the region stopped publishing long ago; the last state we
                # hold keeps ageing and the policy judges it stale.
                continue
            state = self._decode(self._region_keys[region], raw, codec.decode_region_state)
            if state is not None:
                self._live[region] = state

    def _apply_signals(self, raw_by_key: Mapping[str, bytes | None]) -> None:
        for key, raw in raw_by_key.items():
            if raw is None:
                continue
            signal = self._decode(key, raw, codec.decode_signal)
            if signal is None:
                continue
            if signal.kind != CARBON_KIND:
                self._note_bad(key, f"expected kind {CARBON_KIND!r}, got {signal.kind!r}")
                continue
            for grid_zone in self._signal_zones[key]:
                self._carbon[grid_zone] = signal

    def _apply_daily_max(self, raw_by_key: Mapping[str, bytes | None]) -> None:
        for key, raw in raw_by_key.items():
            if raw is None:
                continue  # none recorded yet (or expired): the fleet-wide bound applies
            days = decode_daily_max(raw, key)
            if days:
                for grid_zone in self._max_zones[key]:
                    self._daily_max[grid_zone] = days

    def _carbon_bounds(self, now: float) -> dict[str, float]:
        """Per grid zone, its highest accepted intensity over the policy's trailing window
        (what its candidates are priced at while its signal is unusable)."""
        window = self.builder.policy.stale_bounds.carbon_window
        bounds = {}
        for zone, days in self._daily_max.items():
            bound = window_max(days, now, window)
            if bound is not None:
                bounds[zone] = bound
        return bounds

    def _apply_flags(self, raw: bytes | None) -> None:
        if raw is None:
            self._energy_routing = True  # absent flags record: energy routing on
            return
        enabled = self._decode(keys.FLAGS, raw, parse_flags)
        if enabled is not None:
            self._energy_routing = enabled

    def _decode(self, key: str, raw: bytes, decode: Callable[[bytes], T]) -> T | None:
        try:
            value = decode(raw)
        except ValueError as exc:
            self._note_bad(key, str(exc))
            return None
        self._bad_records.pop(key, None)
        return value

    def _note_bad(self, key: str, problem: str) -> None:
        # Logged once per distinct problem, not every refresh.
        if self._bad_records.get(key) != problem:
            log.warning("ignoring malformed store record %s (keeping the last good value): %s", key, problem)
        self._bad_records[key] = problem

    async def start(self) -> None:
        """One refresh now (so the first request sees the store), then every ``interval_s``."""
        if self._task is not None:
            return
        self._live_since = self.clock()
        if self.probes is not None:
            await self.probes.start()
        await self.refresh()
        self._task = start_loop(self._run, "snapshot-refresher")

    async def _run(self) -> None:
        # (A bug in one refresh does not stop the loop; the snapshot ages instead.)
        await run_every(self.interval_s, self.refresh, "snapshot refresh", first_after_s=self.interval_s)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        if self.probes is not None:
            await self.probes.stop()
