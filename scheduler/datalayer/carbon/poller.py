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
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from scheduler.datalayer.carbon import metrics
from scheduler.datalayer.carbon.base import CarbonProvider, Fetched
from scheduler.datalayer.carbon.errors import ProviderError
from scheduler.datalayer.carbon.http import Clock, Sleep
from scheduler.datalayer.carbon.metrics import Counters
from scheduler.datalayer.carbon.store_io import read_signal, write_forecast, write_signal
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.types import Signal

log = logging.getLogger(__name__)

# After a failed poll, try again after this long (or the poll interval, if shorter).
RETRY_FAILED_S = 60.0


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
                next_due = self.clock() + (self.interval_s if ok else min(self.interval_s, RETRY_FAILED_S))
            await self.sleep(max(0.0, min(next_due - self.clock(), self.lock.contend_every_s)))

    async def _due_after_takeover(self) -> float:
        try:
            stored = await read_signal(self.store, self.zone)
        except StateUnavailable:
            return self.clock()
        return self.clock() if stored is None else stored.fetched_at + self.interval_s

    async def poll_once(self) -> bool:
        """Fetch and write; True when every part of the fetch succeeded. Never raises for a
        provider or store failure."""
        self.counters.inc(metrics.POLLS, self._labels())
        try:
            fetched = await self.provider.fetch(self.zone)
        except Exception:
            log.exception("%s: provider raised instead of reporting a failure", self.lock_name)
            fetched = Fetched(failures=(ProviderError(self.provider.name, "fetch", "internal", "see traceback"),))
        for failure in fetched.failures:
            await self._report(failure)
        if not self.held:
            log.info("%s: lock lost during the fetch; not writing", self.lock_name)
            return False
        try:
            for signal in fetched.latest:
                await self._write_latest(signal)
            if fetched.forecast:
                await write_forecast(self.store, self.zone, fetched.forecast)
                self.counters.inc(metrics.WRITES, {**self._labels(), "kind": "forecast"})
        except StateUnavailable as exc:
            log.warning("%s: store unavailable, signals not written: %s", self.lock_name, exc)
            self.counters.inc(metrics.FAILURES, {**self._labels(), "reason": "store_unavailable"})
            return False
        return not fetched.failures

    async def _write_latest(self, signal: Signal) -> None:
        stored = await read_signal(self.store, signal.key, signal.kind)
        if stored is not None and stored.observed_at > signal.observed_at:
            log.warning("%s: provider answered with %s observed at %.0f, older than the stored %.0f; keeping it",
                        self.lock_name, signal.kind, signal.observed_at, stored.observed_at)
            return
        await write_signal(self.store, signal)
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
