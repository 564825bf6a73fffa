"""Reloads, publishes and adopts config versions for one router (``ConfigReloader``, by the rules
of the package's docstring); ``ReloadOutcome`` is what one reload answers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.canary.runtime import CanaryRuntime
from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import ConfigError, ConfigIssue
from scheduler.config.schema import RegionConfig
from scheduler.datalayer.refresher import SnapshotRefresher
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.server.auth import KeyRing
from scheduler.server.config_reload.sources import (
    PARTS,
    ConfigBundle,
    ConfigSources,
    ConfigVersion,
    Identity,
    LoadedConfig,
    files_identity,
    load_local,
    validate_bundle,
)
from scheduler.server.config_reload.store import ConfigStore, PublishedConfig, default_owner
from scheduler.server.config_signing import INVALID, ROLLBACK, BundleRefused, BundleSignature, ConfigTrust, SigningError
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import run_every, start_loop, stop_task
from scheduler.tickets import TicketKeyRing
from scheduler.v1 import admin_pb2

log = logging.getLogger(__name__)

# Refused store bundles remembered so that each is logged once (the oldest are forgotten).
MAX_REMEMBERED_REFUSALS = 256


class ReloadedRouter(Protocol):
    """The parts of the router a config version is applied to (``scheduler.server.app.RouterDeps``
    holds them; scheduler.server.router_parts has the other seams)."""

    refresher: SnapshotRefresher
    canary: CanaryRuntime | None
    store: StateStore
    # Replaced by a version's key ring (the edge reads it per call).
    keys: KeyRing | None

    # The ledgers and carbon pollers among them follow a new version.
    @property
    def background(self) -> Sequence[object]: ...


@dataclass(frozen=True)
class ReloadOutcome:
    ok: bool
    changed: bool
    version: str
    previous_version: str
    digest: str = ""
    problems: tuple[ConfigIssue, ...] = ()
    published: bool = False
    publish_error: str = ""
    source: str = ""

    def to_proto(self) -> admin_pb2.ReloadConfigResponse:
        return admin_pb2.ReloadConfigResponse(
            ok=self.ok, changed=self.changed, version=self.version, previous_version=self.previous_version,
            files_digest=self.digest, published=self.published, publish_error=self.publish_error, source=self.source,
            problems=[admin_pb2.ConfigProblem(file=p.file, field=p.field, message=p.message) for p in self.problems])


LOCAL_SOURCE = "local files"
STANDALONE = ("not published: this router trusts no config key (no --config-trust), so it neither publishes "
              "versions nor adopts them (docs/hot-reload.md)")


def _when(unix_s: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix_s))


@dataclass
class ConfigReloader:
    """Reloads, publishes and adopts config versions for one router (a ``BackgroundTask``:
    start it after the router's other parts; see the package's docstring)."""

    deps: ReloadedRouter
    sources: ConfigSources
    # What the router was started on (validated by ``load_local``).
    current: LoadedConfig
    ticket_keys: TicketKeyRing | None = None
    ticket_keys_file: str = "--ticket-keys"
    # Whose signatures make a version adoptable (the default trusts none: standalone).
    trust: ConfigTrust = field(default_factory=ConfigTrust)
    # Seconds between checks of the files for changes (0: no watching; SIGHUP and the RPC still work).
    watch_interval_s: float = 2.0
    # Seconds between reads of the store's head: how soon a version published elsewhere is adopted.
    sync_interval_s: float = 1.0
    owner: str = field(default_factory=default_owner)
    clock: Callable[[], float] = time.time
    version: ConfigVersion = field(init=False)
    source: str = field(default=LOCAL_SOURCE, init=False)
    # The problems of the last failed attempt (empty after a good one).
    problems: tuple[ConfigIssue, ...] = field(default=(), init=False)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter, init=False)
    # Store records refused, by reason (scheduler_config_rejected_total).
    rejected: Counter[str] = field(default_factory=Counter, init=False)
    # The last store record refused, "<version>: <reason>: <why>" ("" while none).
    last_rejection: str = field(default="", init=False)
    _store: ConfigStore = field(init=False, repr=False)
    # The store record of the version in use (None: not published).
    _record: PublishedConfig | None = field(default=None, init=False, repr=False)
    # The operator's signature of the version in use (None: unsigned).
    _signature: BundleSignature | None = field(default=None, init=False, repr=False)
    # "join": not synced with the store since the start; "publish": a local reload waits for the store.
    _intent: str | None = field(default="join", init=False, repr=False)
    # Why the local reload that waits for the store ("publish") is not published yet.
    _waiting_because: str = field(default="", init=False, repr=False)
    _refused: int = field(default=0, init=False, repr=False)
    # Fingerprints of the refused store bundles already logged (an insertion-ordered set).
    _logged: dict[str, None] = field(default_factory=dict, init=False, repr=False)
    # The content of this router's own files when it last read them (valid): a file change or
    # SIGHUP publishes them only when it changed.
    _local_digest: str = field(default="", init=False, repr=False)
    _store_error: str = field(default="", init=False, repr=False)
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)
    _seen: Identity | None = field(default=None, init=False, repr=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False, repr=False)
    _signalled: set[asyncio.Task[ReloadOutcome]] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.version = ConfigVersion(0, self.current.bundle.digest)
        self._local_digest = self.current.bundle.digest
        self._store = ConfigStore(self.deps.store, refused=self._unreadable)
        # The snapshot says which version it was built from from the first one on.
        self.deps.refresher.builder.config_version = self.version.label
        try:
            self._signature = self._files_signature(self.current.bundle)
        except ConfigError as exc:
            # The router still runs on its files; it only cannot publish them.
            for issue in exc.issues:
                log.warning("config: this router's files will not be published: %s", issue)

    @property
    def published(self) -> bool:
        """Whether the version in use is in the store (False: local, not yet published)."""
        return self._record is not None

    @property
    def signature(self) -> BundleSignature | None:
        """The operator's signature of the version in use (None: unsigned)."""
        return self._signature

    @property
    def signed_at(self) -> float:
        """When the version in use was signed (0: unsigned): an older signature is a replay."""
        return self._signature.signed_at if self._signature is not None else 0.0

    def _files_signature(self, bundle: ConfigBundle) -> BundleSignature | None:
        """The operator's signature of this router's files, checked; None when they are not
        published anyway (standalone) or may go unsigned (allow_unsigned without a signature
        file). ``ConfigError`` when this router may not publish them."""
        if self.trust.standalone:
            return None
        path = self.sources.signature
        if path is None:
            if self.trust.allow_unsigned:
                return None
            raise ConfigError([ConfigIssue("--config-signature", "", (
                "these files are not signed, and this router takes only signed config (--config-trust): sign "
                "them with `scheduler config sign` and pass --config-signature FILE, or publish them with "
                "`scheduler config publish`"))])
        try:
            signature = BundleSignature.load(path)
            self.trust.check(bundle.digest, signature)
        except SigningError as exc:
            raise ConfigError([ConfigIssue(str(path), "", str(exc).removeprefix(f"{path}: "))]) from None
        except BundleRefused as exc:
            raise ConfigError([ConfigIssue(str(path), "", f"{exc.message} ({exc.reason})")]) from None
        if signature.signed_at < self.signed_at:
            raise ConfigError([ConfigIssue(str(path), "signed_at", (
                f"signed at {_when(signature.signed_at)}, before the version in use ({_when(self.signed_at)}): "
                "sign these files again to go back to them"))])
        return signature

    # --- triggers ---------------------------------------------------------------------

    async def reload(self, trigger: str, dry_run: bool = False, only_if_changed: bool = False) -> ReloadOutcome:
        """Read and validate this router's files; apply and publish them when they are valid
        and differ from the version in use. ``only_if_changed`` (a file change, SIGHUP): not
        when their content is what this router last read, even if the fleet has moved on to
        another router's version since (the RPC, without it, publishes them then: a rollback).
        Never raises for a bad file: the outcome says."""
        async with self._lock:
            previous = self.version.label
            published = self._record is not None
            try:
                loaded = await asyncio.to_thread(load_local, self.sources, self.ticket_keys, self.ticket_keys_file,
                                                 self.current.keys)
            except ConfigError as exc:
                return self._refused_files(trigger, exc, dry_run)
            digest = loaded.bundle.digest
            unchanged = digest == self.current.bundle.digest or (only_if_changed and digest == self._local_digest)
            try:
                signature = self._files_signature(loaded.bundle)
            except ConfigError as exc:
                if not unchanged:
                    return self._refused_files(trigger, exc, dry_run)
                # Files that change nothing need no signature (a touch, a fleet-wide SIGHUP).
                signature = None
            if dry_run:
                return ReloadOutcome(True, False, previous, previous, digest, source=self.source, published=published)
            self.problems = ()
            self._local_digest = digest
            if digest == self.current.bundle.digest and self._record is None and self._signature is None \
                    and signature is not None:
                # The files in use got their signature (it landed after them): publish them.
                self._signature = signature
                self._intent = self._intent or "publish"
            if unchanged:
                self.counts[(trigger, "unchanged")] += 1
                log.info("config reload (%s): the files are unchanged (version %s in use); nothing to do", trigger,
                         previous)
                # Unchanged, yet maybe not published: a reload applied moments ago (by the file
                # watcher, say) that waits for the store says why, whichever trigger came first.
                waiting = self._waiting_because if not published and self._intent == "publish" else ""
                return ReloadOutcome(True, False, previous, previous, digest, source=self.source, published=published,
                                     publish_error=waiting)
            if self.trust.standalone:
                version = ConfigVersion(0, digest)
                await self._apply(loaded, version, LOCAL_SOURCE, None, None, trigger)
                self.counts[(trigger, "applied")] += 1
                return ReloadOutcome(True, True, version.label, previous, digest, publish_error=STANDALONE,
                                     source=self.source)
            record, error = None, ""
            try:
                record = await self._store.publish(loaded.bundle, self.version.counter, self.owner, self.clock(),
                                                   trigger, signature)
            except StateUnavailable as exc:
                error = f"the state store is unreachable; this router uses the new version and publishes it when " \
                        f"the store answers: {exc}"
            version = record.version if record is not None else ConfigVersion(0, digest)
            await self._apply(loaded, version, LOCAL_SOURCE, record, signature, trigger)
            # A reload made during an outage is published when the store answers (also over
            # the start-up join: the operator's reload is the newer intent).
            self._intent = None if record is not None else "publish"
            self._waiting_because = error
            self.counts[(trigger, "applied")] += 1
            if error:
                log.warning("config version %s not published yet: %s", version.label, error)
            return ReloadOutcome(True, True, version.label, previous, digest, published=record is not None,
                                 publish_error=error, source=self.source)

    def _refused_files(self, trigger: str, exc: ConfigError, dry_run: bool) -> ReloadOutcome:
        if not dry_run:
            self._refuse(trigger, exc.issues, f"this router's files ({trigger})")
        return ReloadOutcome(False, False, self.version.label, self.version.label, problems=exc.issues,
                             source=self.source, published=self._record is not None)

    def on_sighup(self) -> None:
        """The SIGHUP handler (the event loop's): reload in a task."""
        task = asyncio.get_running_loop().create_task(self.reload("SIGHUP", only_if_changed=True),
                                                      name="config-reload")
        self._signalled.add(task)
        task.add_done_callback(self._signalled.discard)

    # --- the store ----------------------------------------------------------------------

    async def sync(self) -> None:
        """One pass with the store: join it (after the start), publish a reload made while it
        was unreachable, or adopt a newer version published by another router."""
        async with self._lock:
            try:
                if self._intent == "join":
                    await self._join()
                elif self._intent == "publish":
                    await self._publish_pending()
                else:
                    await self._follow()
            except StateUnavailable as exc:
                if not self._store_error:
                    log.warning("config sync: the state store is unreachable; version %s stays in use: %s",
                                self.version.label, exc)
                self._store_error = str(exc)
                return
            if self._store_error:
                log.warning("config sync: the state store answers again (version %s in use)", self.version.label)
                self._store_error = ""

    async def _join(self) -> None:
        local = self.current
        digest = local.bundle.digest
        head, newest = await self._store.newest(0)
        if newest is not None and not self._trusted(newest):
            newest = None  # refused (reported): as if the store had none
        publishable = not self.trust.standalone and (self._signature is not None or self.trust.allow_unsigned)
        if newest is not None and newest.bundle.digest == digest:
            await self._relabel(newest)
            log.info("config: this router's files are the fleet's version %s", newest.version.label)
        elif newest is not None and (not publishable or await self._store.published_before(digest)
                                     or self.signed_at < newest.signed_at):
            # Old files (published before, or signed before the fleet's version), or files
            # this router may not publish: the fleet's version wins.
            log.warning("config: this router's files (%s) give way to the fleet's version %s (%s)",
                        ConfigVersion(0, digest).label, newest.version.label,
                        "they are not signed" if not publishable else "they are older")
            await self._adopt(newest)
        elif publishable:
            record = await self._store.publish(local.bundle, head.counter if head is not None else 0, self.owner,
                                               self.clock(), "startup", self._signature)
            await self._relabel(record)
            log.warning("config version %s published: this router started on files the fleet had not seen%s",
                        record.version.label, f" (they replace version {head.counter})" if head is not None else "")
        else:
            log.warning("config: this router runs on its own files (%s), %s", self.version.label,
                        STANDALONE if self.trust.standalone else
                        "not published: they are not signed (--config-signature); it adopts the first signed version "
                        "published")
        self._intent = None

    async def _publish_pending(self) -> None:
        record = await self._store.publish(self.current.bundle, self.version.counter, self.owner, self.clock(),
                                           "reload-during-outage", self._signature)
        await self._relabel(record)
        self._intent = None
        log.warning("config version %s published (reloaded while the store was unreachable)", record.version.label)

    async def _follow(self) -> None:
        head, newest = await self._store.newest(self.version.counter)
        if newest is not None and newest.counter > self.version.counter and newest.counter != self._refused:
            await self._adopt(newest)
            return
        record = self._record
        if record is not None and (head is None or head.counter < record.counter) and newest is None:
            # The store lost the head (a restart without persistence) or a racing publisher
            # left it behind: put this router's version back.
            await self._store.repair(record)
            log.warning("config: the store's head was %s; put version %s back", "missing" if head is None
                        else f"at {head.counter}", record.version.label)

    def _trusted(self, record: PublishedConfig) -> bool:
        """Whether ``record``'s signature lets this router adopt it (a refusal is reported)."""
        try:
            self.trust.check(record.bundle.digest, record.signature)
            # An older signature of the files in use replays nothing (two routers may hold
            # signatures of the same files made at different times).
            replayed = record.bundle.digest != self.current.bundle.digest and record.signed_at < self.signed_at
            if record.signature is not None and replayed:
                raise BundleRefused(ROLLBACK, f"signed at {_when(record.signed_at)}, before the version in "
                                              f"use ({_when(self.signed_at)}): a replayed old version")
        except BundleRefused as exc:
            label = record.version.label
            self._refused = record.counter
            self._reject(label, exc.reason, [ConfigIssue(f"store:{label}", "signature", exc.message)],
                         record.fingerprint, f"version {label} published by {record.published_by}")
            return False
        return True

    async def _adopt(self, record: PublishedConfig) -> None:
        label = record.version.label
        if not self._trusted(record):
            return
        if record.bundle.digest == self.current.bundle.digest:
            await self._relabel(record)
            return
        shown = {part: f"store:{label}/{part}" + ("" if part in ("regions", "policies") else ".yaml")
                 for part in PARTS}
        try:
            loaded = await asyncio.to_thread(validate_bundle, record.bundle, self.sources.policy, self.sources.parts,
                                             shown, self.ticket_keys, self.ticket_keys_file, self.current.keys)
        except ConfigError as exc:
            self._refused = record.counter
            self._reject(label, INVALID, exc.issues, record.fingerprint,
                         f"version {label} published by {record.published_by}")
            return
        self.problems = ()
        await self._apply(loaded, record.version, f"store (published by {record.published_by})", record,
                          record.signature, "store")
        self.counts[("store", "adopted")] += 1

    async def _relabel(self, record: PublishedConfig) -> None:
        """The version in use got its store counter (same files)."""
        self._record = record
        if self._signature is None or record.signed_at >= self.signed_at:
            # Of two signatures of the same files, the later one: replays are judged by it.
            self._signature = record.signature
        if record.version != self.version:
            self.version = record.version
            self.deps.refresher.builder.config_version = record.version.label
            await self.deps.refresher.refresh()

    def _unreadable(self, key: str, refused: BundleRefused, fingerprint: str) -> None:
        """A store record that does not parse (``ConfigStore.refused``)."""
        self._reject(key, refused.reason, [ConfigIssue(f"store:{key}", "", refused.message)], fingerprint,
                     f"store record {key}")

    def _reject(self, label: str, reason: str, issues: Iterable[ConfigIssue], fingerprint: str, what: str) -> None:
        """A store record refused: counted by reason, shown by the status, logged once per
        distinct bundle (a record written again under other counters is not logged again)."""
        issues = tuple(issues)
        self.rejected[reason] += 1
        self.last_rejection = f"{label}: {reason}: {issues[0].message if issues else ''}"
        first = fingerprint not in self._logged
        if first:
            self._logged[fingerprint] = None
            if len(self._logged) > MAX_REMEMBERED_REFUSALS:
                del self._logged[next(iter(self._logged))]
        self._refuse("store", issues, f"{what} ({reason})", logged=first)

    def _refuse(self, trigger: str, issues: Iterable[ConfigIssue], what: str, logged: bool = True) -> None:
        self.problems = tuple(issues)
        self.counts[(trigger, "rejected")] += 1
        if not logged:
            return
        log.error("config not reloaded: %d problem(s) in %s; version %s stays in use", len(self.problems), what,
                  self.version.label)
        for issue in self.problems:
            log.error("config not reloaded (version %s stays in use): %s", self.version.label, issue)

    # --- applying ------------------------------------------------------------------------

    async def _apply(self, loaded: LoadedConfig, version: ConfigVersion, source: str, record: PublishedConfig | None,
                     signature: BundleSignature | None, trigger: str) -> None:
        from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers
        from scheduler.datalayer.probes import RegionProbes
        from scheduler.ledger.service import LedgerService

        deps = self.deps
        refresher = deps.refresher
        old = self.current
        previous = self.version.label
        regions_changed = loaded.regions != old.regions
        if regions_changed or loaded.policy != old.policy:
            was = refresher.builder
            builder = SnapshotBuilder(compile_fleet(loaded.regions), compile_policy(loaded.policy),
                                      energy_model=was.energy_model, perf=was.perf, config_version=version.label)
        else:
            builder = refresher.builder
            builder.config_version = version.label
        probes, old_probes = refresher.probes, None
        if probes is not None and regions_changed:
            old_probes = probes
            probes = RegionProbes.of(builder.regions, clock=probes.clock, interval_s=probes.interval_s,
                                     timeout_s=probes.timeout_s)
            await probes.probe_all()
            await probes.start()
            refresher.probes = probes
        if deps.canary is not None:
            # The policy's canary arm is looked up in the new policies (scheduler.canary).
            deps.canary.use_policies({name: compile_policy(policy) for name, policy in loaded.policies.items()})
        # The store is read for the new regions, then the new snapshot replaces the old one;
        # the rest is swapped in the same step of the event loop (no await in between).
        await refresher.use_builder(builder)
        if deps.keys is not None and loaded.keys is not None:
            deps.keys = loaded.keys
        ledgers = [task for task in deps.background if isinstance(task, LedgerService)]
        for ledger in ledgers:
            if "budgets" in self.sources.parts and loaded.budgets is not None:
                ledger.ledger.budgets = loaded.budgets
            ledger.ledger.critical_workload_classes = loaded.policy.critical_workload_classes
        self.current, self.version, self.source, self._record = loaded, version, source, record
        self._signature = signature
        if old_probes is not None:
            await old_probes.stop()
        if regions_changed and _carbon_sources(loaded.regions) != _carbon_sources(old.regions):
            for pollers in [task for task in deps.background if isinstance(task, CarbonPollers)]:
                await pollers.stop()
                fresh = CarbonPollers.from_regions(builder.regions, deps.store, counters=pollers.counters)
                pollers.pollers, pollers.providers = fresh.pollers, fresh.providers
                await pollers.start()
        log.warning("config version %s in use (%s; was %s): %s", version.label, trigger if trigger != "store"
                    else source, previous, _summary(old, loaded))

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        self._seen = files_identity(self.sources)
        try:
            await self.sync()  # join the store's version (or publish these files)
        except Exception:
            log.exception("config sync at start failed; serving on this router's files (%s)", self.version.label)
        self._tasks.append(start_loop(self._sync_loop, "config-sync"))
        if self.watch_interval_s > 0:
            self._tasks.append(start_loop(self._watch_loop, "config-watch"))

    async def stop(self) -> None:
        for task in [*self._tasks, *self._signalled]:
            await stop_task(task)  # type: ignore[arg-type]
        self._tasks.clear()

    async def _sync_loop(self) -> None:
        await run_every(self.sync_interval_s, self.sync, "config sync (the version in use stays)",
                        first_after_s=self.sync_interval_s)

    async def _watch_loop(self) -> None:
        await run_every(self.watch_interval_s, self._reload_if_files_changed,
                        "config reload on a file change (the version in use stays)",
                        first_after_s=self.watch_interval_s)

    async def _reload_if_files_changed(self) -> None:
        identity = await asyncio.to_thread(files_identity, self.sources)
        if identity != self._seen:
            self._seen = identity
            await self.reload("file-change", only_if_changed=True)


def _carbon_sources(regions: Iterable[RegionConfig]) -> set[tuple[str, str, float]]:
    return {(r.carbon.provider, r.carbon.zone, r.carbon.poll_interval_s) for r in regions}


def _summary(old: LoadedConfig, new: LoadedConfig) -> str:
    """What a version changed, in a few words."""
    changed = []
    for part in PARTS:
        before, after = getattr(old.bundle, part), getattr(new.bundle, part)
        if before == after:
            continue
        if isinstance(after, Mapping) and isinstance(before, Mapping):
            files = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
            changed.append(f"{part} ({', '.join(files)})")
        else:
            changed.append(part)
    return ", ".join(changed) or "no file changed"
