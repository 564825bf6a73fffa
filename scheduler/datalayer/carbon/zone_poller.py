"""One poller per (provider, zone) across every router process sharing a store.

Each router runs a ``ZonePoller`` for every (provider, zone) its regions name; they contend
for the store lock ``carbon:{provider}:{zone}`` (``StateStore.acquire_lock`` with a TTL). The
holder renews it every ``ttl/3`` and is the only one that polls and writes; the others retry
every ``contend_s``, so when the holder dies its lock expires within the TTL and one of them
takes over. A new holder polls when the stored signal's ``fetched_at`` is one interval old,
so a takeover does not poll twice in a row.

A failed poll writes nothing: the store keeps the last good signal with its true
``observed_at``, so it goes stale in the open and the carbon scorer abstains once it passes
the policy's ``max_age.carbon``. Every failure is a log line with its reason and a count.

Validated at ingest: a latest value that ``signal_check`` calls unusable (not finite, outside
its kind's physical bounds, or dated beyond the clock-skew tolerance in the future) and a
forecast point with an unusable value are not written; each is counted in
``carbon_signal_rejected_total{provider,zone,part,reason}`` (reason ``invalid`` or ``future``)
and logged once per run of the same rejection, so the last good signal stays and ages.

Cadence: the main part (the latest ``carbon_intensity``) sets it. Polled at the interval while
it arrives; after it fails, again within ``RETRY_FAILED_S`` (or at the interval, if shorter),
unless the failure cannot pass in a minute (``config``, ``auth``, ``unknown_zone``: at the
interval). A secondary part (forecast, WattTime's index) failing never changes the cadence, and
one that answers 403 (not on this key's plan) while the main part works is left out of the
polls for ``PART_NOT_PERMITTED_S``, then tried again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.base import FORECAST, KIND, LATEST, CarbonProvider, Fetched
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.store_io import read_signal, record_daily_max, write_forecast, write_signal
from scheduler.signal_check import signal_problem, value_problem
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.types import Signal
from scheduler.wire.retry import Sleep

log = logging.getLogger(__name__)

# (problem kind, reason) of a signal that must not be stored, or None.
Rejection = tuple[str, str] | None

# After the main part failed, try again after this long (or the poll interval, if shorter).
RETRY_FAILED_S = 60.0
# Failures a retry within a minute cannot fix: the next try is at the poll interval.
LASTING_REASONS = frozenset({"config", "auth", "unknown_zone"})
# A secondary part the key's plan does not permit (HTTP 403) is left out this long.
PART_NOT_PERMITTED_S = 6 * 3600.0


@dataclass(frozen=True)
class LockTiming:
    ttl_s: float = 15.0
    # The holder renews every ttl/3 (two renewals may fail before the lock lapses).
    renew_s: float | None = None
    # The others try to take it this often.
    contend_s: float | None = None

    @property
    def renew_every_s(self) -> float:
        return self.renew_s if self.renew_s is not None else self.ttl_s / 3.0

    @property
    def contend_every_s(self) -> float:
        return self.contend_s if self.contend_s is not None else self.ttl_s / 6.0


@dataclass
class ZonePoller:
    provider: CarbonProvider
    zone: str
    interval_s: float
    store: StateStore
    owner: str
    counters: Counters = field(default_factory=Counters)
    clock: Clock = time.time
    sleep: Sleep = asyncio.sleep
    lock: LockTiming = field(default_factory=LockTiming)
    held: bool = field(default=False, init=False)
    _acquired: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    _terms: int = field(default=0, init=False, repr=False)
    # part -> until when it is left out of the polls (answered 403 while the main part worked)
    _skip_until: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    # (part, kind) -> the rejection reason last logged, so a run of rejections logs once
    _rejecting: dict[tuple[str, str], str] = field(default_factory=dict, init=False, repr=False)
    # Why the main part failed in the last poll (None: it arrived).
    _main_failure: ProviderError | None = field(default=None, init=False, repr=False)

    @property
    def lock_name(self) -> str:
        return f"carbon:{self.provider.name}:{self.zone}"

    def _labels(self) -> dict[str, str]:
        return {"provider": self.provider.name, "zone": self.zone}

    async def run(self) -> None:
        """Until cancelled; releases the lock on the way out so another router takes over now."""
        try:
            await asyncio.gather(self._keep_lock(), self._poll_loop())
        finally:
            if self.held:
                self.held = False
                try:
                    await self.store.release_lock(self.lock_name, self.owner)
                except StateUnavailable as exc:
                    log.warning("%s: could not release the lock (%s); it lapses in %.0f s", self.lock_name, exc,
                                self.lock.ttl_s)

    async def _keep_lock(self) -> None:
        while True:
            try:
                held = await self.store.acquire_lock(self.lock_name, self.owner, self.lock.ttl_s)
            except StateUnavailable as exc:
                if self.held:
                    log.warning("%s: store unavailable (%s); stopping polls until the lock is renewed", self.lock_name,
                                exc)
                held = False
            except Exception:
                log.exception("%s: unexpected error renewing the lock", self.lock_name)
                held = False
            if held != self.held:
                self.held = held
                change = "acquired" if held else "lost"
                log.info("%s: lock %s by %s", self.lock_name, change, self.owner)
                self.counters.inc(metrics.LOCK_CHANGES, {**self._labels(), "change": change})
                if held:
                    self._terms += 1
                    self._acquired.set()
                else:
                    self._acquired.clear()
            await self.sleep(self.lock.renew_every_s if held else self.lock.contend_every_s)

    async def _poll_loop(self) -> None:
        term, next_due = -1, 0.0
        while True:
            await self._acquired.wait()
            if term != self._terms:  # a new term: another router may have polled meanwhile
                term, next_due = self._terms, await self._due_after_takeover()
            if self.clock() >= next_due:
                try:
                    ok = await self.poll_once()
                except Exception:  # a store error other than "unavailable": log, count, go on
                    log.exception("%s: poll failed unexpectedly", self.lock_name)
                    self.counters.inc(metrics.FAILURES, {**self._labels(), "reason": "internal"})
                    ok = False
                next_due = self.clock() + self.next_poll_in_s(ok)
            await self.sleep(max(0.0, min(next_due - self.clock(), self.lock.contend_every_s)))

    async def _due_after_takeover(self) -> float:
        try:
            stored = await read_signal(self.store, self.zone)
        except StateUnavailable:
            return self.clock()
        return self.clock() if stored is None else stored.fetched_at + self.interval_s

    def next_poll_in_s(self, main_ok: bool) -> float:
        """Seconds to the next poll after one whose main part did (not) arrive."""
        failure = self._main_failure
        if main_ok or (failure is not None and failure.reason in LASTING_REASONS):
            return self.interval_s
        return min(self.interval_s, RETRY_FAILED_S)

    def skipped_parts(self) -> frozenset[str]:
        """The secondary parts left out of polls now (not permitted on this key's plan)."""
        now = self.clock()
        return frozenset(part for part, until in self._skip_until.items() if until > now)

    async def poll_once(self) -> bool:
        """Fetch, validate and write; True when the main part (the latest carbon intensity)
        arrived, passed validation and was written. Never raises for a provider or store
        failure."""
        self.counters.inc(metrics.POLLS, self._labels())
        self._main_failure = None
        try:
            fetched = await self.provider.fetch(self.zone, self.skipped_parts())
        except Exception:
            log.exception("%s: provider raised instead of reporting a failure", self.lock_name)
            fetched = Fetched(failures=(ProviderError(self.provider.name, "fetch", "internal", "see traceback"),))
        for failure in fetched.failures:
            await self._report(failure)
            if failure.part in (LATEST, None):
                self._main_failure = failure
        self._leave_out_refused_parts(fetched.failures)
        if not self.held:
            log.info("%s: lock lost during the fetch; not writing", self.lock_name)
            return False
        now = self.clock()
        latest = self._usable(fetched.latest, LATEST, lambda s: _latest_problem(s, now))
        forecast = self._usable(fetched.forecast, FORECAST, _forecast_problem)
        try:
            for signal in latest:
                await self._write_latest(signal)
            if forecast:
                await write_forecast(self.store, self.zone, forecast)
                self.counters.inc(metrics.WRITES, {**self._labels(), "kind": "forecast"})
        except StateUnavailable as exc:
            log.warning("%s: store unavailable, signals not written: %s", self.lock_name, exc)
            self.counters.inc(metrics.FAILURES, {**self._labels(), "reason": "store_unavailable"})
            return False
        return self._main_failure is None and any(s.kind == KIND for s in latest)

    def _usable(self, signals: Sequence[Signal], part: str, check: Callable[[Signal], Rejection]) -> list[Signal]:
        """The signals that pass ``check``; each one rejected is counted, and a run of polls
        rejecting the same (part, kind) for the same reason is logged once."""
        kept: list[Signal] = []
        first: dict[str, tuple[str, str]] = {}  # kind -> its first rejection in this poll
        for signal in signals:
            problem = check(signal)
            if problem is None:
                kept.append(signal)
                continue
            self.counters.inc(metrics.REJECTED, {**self._labels(), "part": part, "reason": problem[0]})
            first.setdefault(signal.kind, problem)
        for kind in {s.kind for s in signals}:
            key = (part, kind)
            if kind not in first:
                if self._rejecting.pop(key, None) is not None:
                    log.info("carbon signal %s: %s %s usable again", self.lock_name, part, kind)
                continue
            reason_kind, reason = first[kind]
            if self._rejecting.get(key) != reason_kind:
                self._rejecting[key] = reason_kind
                kept_instead = "the last good one stays and ages" if part == LATEST else "stored without it"
                log.warning("carbon signal %s: %s %s rejected, not stored (%s); %s (logged once until this changes)",
                            self.lock_name, part, kind, reason, kept_instead)
        return kept

    def _leave_out_refused_parts(self, failures: tuple[ProviderError, ...]) -> None:
        """A secondary part refused with 403 while the main part was not: the key's plan does not
        cover it (a 403 on the main part too means the key itself is refused)."""
        if any(f.part in (LATEST, None) and f.status == 403 for f in failures):
            return
        for failure in failures:
            if failure.part in (LATEST, None) or failure.status != 403:
                continue
            self._skip_until[failure.part] = self.clock() + PART_NOT_PERMITTED_S
            self.counters.inc(metrics.PARTS_LEFT_OUT, {**self._labels(), "part": failure.part})
            log.warning("carbon signal %s: %s not permitted on this plan (HTTP 403); left out of the polls for %.0f s,"
                        " the main signal polls every %.0f s", self.lock_name, failure.part, PART_NOT_PERMITTED_S,
                        self.interval_s)

    async def _write_latest(self, signal: Signal) -> None:
        stored = await read_signal(self.store, signal.key, signal.kind)
        if stored is not None and stored.observed_at > signal.observed_at:
            log.warning("%s: provider answered with %s observed at %.0f, older than the stored %.0f; keeping it",
                        self.lock_name, signal.kind, signal.observed_at, stored.observed_at)
            return
        await write_signal(self.store, signal)
        await record_daily_max(self.store, signal)
        self.counters.inc(metrics.WRITES, {**self._labels(), "kind": signal.kind})

    async def _report(self, failure: ProviderError) -> None:
        self.counters.inc(metrics.FAILURES, {**self._labels(), "reason": failure.reason})
        try:
            stored = await read_signal(self.store, self.zone)
        except StateUnavailable:
            stored = None
        if stored is None:
            kept = "no signal stored"
        else:
            observed = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stored.observed_at))
            kept = f"the stored signal stays as observed at {observed} ({self.clock() - stored.observed_at:.0f} s old)"
        log.warning("carbon signal %s: %s; %s", self.lock_name, failure, kept)


def _latest_problem(signal: Signal, now: float) -> Rejection:
    """Unusable at any age: an invalid value, or dated beyond the clock-skew tolerance ahead."""
    problem = signal_problem(signal, now, math.inf)
    return None if problem is None else (problem.kind, problem.reason)


def _forecast_problem(signal: Signal) -> Rejection:
    """A forecast point is dated ahead by nature: only its value is checked."""
    invalid = value_problem(signal)
    return None if invalid is None else ("invalid", f"{signal.key} from {signal.source}: {invalid}")
