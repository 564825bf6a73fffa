"""Hot reload of the router's config (regions/, policies/, the keys file, the budgets file),
and one config version for every router that shares the store.

Triggers: ``SIGHUP``, a change of any of the files (their mtime, size or inode, checked every
``watch_interval_s``; a Kubernetes ConfigMap or Secret update swaps a symlink) and the admin RPC
``RouterAdmin/ReloadConfig`` (``scheduler config reload --router ADDR``). Each reads every file
once into a ``ConfigBundle`` (the texts) and validates the bundle as a whole, with the loaders
the router starts with (``scheduler.config.loader``: every problem named by file, field and
value; the keys file; the budgets file; the policy named by ``--policy``; a ticket key for every
region). A bundle with any problem changes nothing: the version in use stays, and each problem
goes to the log (ERROR), to ``/metrics`` (``scheduler_config_problem{file,field,message}``) and
into the RPC's answer. All or nothing: one bad file keeps every file's last good version.

Versions. A bundle's content hash (sha256 of its files, ``ConfigBundle.digest``) and a counter
that only grows make its version, ``<counter>-<hash[:12]>`` (``local-<hash[:12]>`` while not
yet published). The store holds them (``scheduler.state`` keys, relative):

- ``config:version:<n>``: version n, its bundle, who published it and when. Written once,
  with SET NX: two routers cannot both claim n. The last ``KEEP_VERSIONS`` are kept.
- ``config:head``: ``{counter, digest}`` of the newest version (a pointer, read every
  ``sync_interval_s`` by every router; small).
- ``config:digest:<hash>``: marks a bundle as published once (the start-up rule below).

A router that reloads a valid bundle that differs from the one in use claims the next
counter, writes its version and moves the head: its files become the fleet's config (the last
publication wins; a collision on a counter moves the later publisher to the next one). A file
change or SIGHUP does so only when the files' content changed since this router last read them
(a router with stale files does not revert the fleet on a touch or a fleet-wide SIGHUP); the
RPC does so whenever they differ from the version in use (a rollback to them). Every
router's sync loop reads the head (and version ``n + 1`` beside it, which repairs a head that
two racing publishers left one behind), validates a newer version's bundle the same way and
adopts it: every router converges within ``sync_interval_s`` plus a validation (1 s + ~0.1 s).
A version that fails validation on a router (e.g. a region it has no ticket key for) is not
adopted there: that router keeps its version and reports the problems, once per version.

Signatures (``scheduler.server.config_signing``). Whoever can write the store could publish a
version, so a router adopts one only when it is signed by an operator key it trusts
(``ConfigTrust``: ``--config-trust``), and refuses the rest: no signature, an unknown key id, a
bad signature, a hash that does not match the files, a malformed record, one signed before the
version in use (a replay), or files that fail validation. A refused record keeps the version in
use; it is logged once per distinct bundle, counted (``scheduler_config_rejected_total{reason}``)
and shown by ``RouterAdmin/GetStatus``. A router publishes its own files only with a signature
that verifies (``--config-signature``, written by ``scheduler config sign``); operators publish
straight to the store with ``scheduler config publish``. Three modes:

- signed (trusted keys): as above; a reload of this router's own files needs their signature
  (unsigned files serve only from the start until the store offers a signed version);
- standalone (no key, the default): the router runs on its own files and reloads them, but
  neither publishes nor adopts versions (every store record is refused);
- ``allow_unsigned`` (``--config-allow-unsigned``, development): unsigned versions are
  published and adopted as before signing existed; signed ones must still verify.

A version must also keep the router usable: a key list that is empty, or that has no admin key
while the keys in use have one, is refused (``auth.key_ring_issues``), from a file as from the
store.

Parts: a router uses the parts it was started with. A version that lacks one of them (no
keys file for a router that authenticates, no budgets file for one that enforces budgets) is
refused: a store record never turns authentication or budgets off. Parts a router was not
started with are ignored (an ``--insecure`` router does not start authenticating).

Start-up: the router validates its own files (a bad file stops it, as before) and then
- the store has no version: it publishes its files;
- the head has the same content: it takes the head's version;
- its files were published before and another version followed (an old replica restarting
  with old files): it adopts the head, it does not revert the fleet;
- its files were never published (a new rollout): it publishes them, and they become the
  fleet's version.

While the store is unreachable a router keeps serving on its last good config. A reload then
applies locally at once (version ``local-<hash>``) and is published when the store answers
again (it is then the newest version: the last publication wins); a router started during an
outage runs on its own files and joins as above when the store answers.

Applying a version swaps the snapshot whole (a new ``SnapshotBuilder`` over the new regions and
policy, labelled with the version; the refresher reads the store for the new regions first),
then, in the same step of the event loop, the key ring and the ledger's budgets and critical
classes; the region probes and carbon pollers then follow the new regions. A request in flight finishes on the
snapshot it was decided on, and its decision and receipt carry that snapshot's version
(``FleetSnapshot.config_version``). Not reloaded: ``--policy`` (the name), the ticket keys, TLS,
ports and the other command-line settings.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scheduler.config.loader import ConfigError, ConfigIssue
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.ledger.budget import BudgetError, TenantBudget, load_budgets
from scheduler.server.auth import KeyRing, key_ring_issues
from scheduler.server.config_signing import (
    DIGEST_MISMATCH,
    INVALID,
    MALFORMED,
    ROLLBACK,
    SIGNATURE_REASONS,
    BundleRefused,
    BundleSignature,
    ConfigTrust,
    SigningError,
)
from scheduler.state.store import StateStore, StateUnavailable
from scheduler.tasks import start_loop, stop_task
from scheduler.tickets import TicketKeyRing
from scheduler.v1 import admin_pb2

if TYPE_CHECKING:
    from scheduler.server.app import RouterDeps

log = logging.getLogger(__name__)

HEAD_KEY = "config:head"
KEEP_VERSIONS = 16
# Version records are pruned by the publishers (KEEP_VERSIONS), not by a TTL.
FOREVER_S = 10 * 365 * 86400.0
# A store record larger than this is not read as a bundle.
MAX_BUNDLE_BYTES = 16 * 2**20
MAX_CLAIMS = 64
# Problems shown on /metrics (the first of the last failed attempt).
MAX_PROBLEM_SAMPLES = 20
# Refused store bundles remembered so that each is logged once (the oldest are forgotten).
MAX_REMEMBERED_REFUSALS = 256
PARTS = ("regions", "policies", "keys", "budgets")
YAML_SUFFIXES = (".yaml", ".yml")

Identity = tuple[tuple[str, tuple[int, int, int] | None], ...]


def version_key(counter: int) -> str:
    return f"config:version:{counter}"


def digest_key(digest: str) -> str:
    return f"config:digest:{digest}"


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


# --- what is read and validated --------------------------------------------------------


@dataclass(frozen=True)
class ConfigSources:
    """Where this router's config files are (its command line)."""

    regions_dir: Path
    policies_dir: Path
    # The policy the router routes with (a name in policies/; not reloadable).
    policy: str
    keys: Path | None = None
    budgets: Path | None = None
    # The operator's detached signature of these files (``scheduler config sign``): what lets
    # this router publish them. Not part of the bundle; watched with the files.
    signature: Path | None = None

    @property
    def parts(self) -> frozenset[str]:
        """The parts this router uses: regions and policies, and keys / budgets if given."""
        used = {"regions", "policies"}
        if self.keys is not None:
            used.add("keys")
        if self.budgets is not None:
            used.add("budgets")
        return frozenset(used)

    def shown(self) -> dict[str, str]:
        """How problems name each part: the paths as given."""
        return {"regions": str(self.regions_dir), "policies": str(self.policies_dir),
                "keys": str(self.keys), "budgets": str(self.budgets)}


@dataclass(frozen=True)
class ConfigBundle:
    """The config's files as text: what is validated, hashed, published and adopted."""

    # file name (no folder) -> its text
    regions: Mapping[str, str]
    policies: Mapping[str, str]
    keys: str | None = None
    budgets: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"regions": dict(sorted(self.regions.items())), "policies": dict(sorted(self.policies.items())),
                "keys": self.keys, "budgets": self.budgets}

    @classmethod
    def from_dict(cls, data: object) -> ConfigBundle:
        """ValueError when ``data`` is not a bundle."""
        if not isinstance(data, dict):
            raise ValueError(f"a bundle is an object, got {type(data).__name__}")
        files: dict[str, dict[str, str]] = {}
        for part in ("regions", "policies"):
            entries = data.get(part)
            if not isinstance(entries, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in entries.items()):
                raise ValueError(f"{part}: expected an object of file name -> text")
            files[part] = entries
        optional = {}
        for part in ("keys", "budgets"):
            value = data.get(part)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{part}: expected a text or null")
            optional[part] = value
        return cls(files["regions"], files["policies"], optional["keys"], optional["budgets"])

    @cached_property
    def digest(self) -> str:
        """sha256 of the canonical JSON of every file (names and texts): the content hash."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class ConfigVersion:
    # 0: not published (the store was unreachable, or not yet joined)
    counter: int
    digest: str

    @property
    def label(self) -> str:
        return f"{self.counter}-{self.digest[:12]}" if self.counter > 0 else f"local-{self.digest[:12]}"


@dataclass(frozen=True)
class LoadedConfig:
    """A bundle that passed validation, and what the router runs on from it."""

    bundle: ConfigBundle
    regions: tuple[RegionConfig, ...]
    policies: Mapping[str, PolicyConfig]
    policy: PolicyConfig
    # None: the part is not used by this router (see ``ConfigSources.parts``)
    keys: KeyRing | None
    budgets: Mapping[str, TenantBudget] | None


def _yaml_files(directory: Path) -> list[Path]:
    return sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")])


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError([ConfigIssue(str(path), "", "not UTF-8 text")]) from None
    except OSError as exc:
        raise ConfigError([ConfigIssue(str(path), "", f"cannot read: {exc.strerror or exc}")]) from None


def read_bundle(sources: ConfigSources) -> ConfigBundle:
    """Every file of the config, read once (``ConfigError`` when one cannot be read)."""
    issues: list[ConfigIssue] = []
    parts: dict[str, dict[str, str]] = {}
    for part, directory in (("regions", sources.regions_dir), ("policies", sources.policies_dir)):
        parts[part] = {}
        if not directory.is_dir():
            issues.append(ConfigIssue(str(directory), "", "not a directory"))
            continue
        for path in _yaml_files(directory):
            try:
                parts[part][path.name] = _read_text(path)
            except ConfigError as exc:
                issues.extend(exc.issues)
    single: dict[str, str | None] = {}
    for part, file in (("keys", sources.keys), ("budgets", sources.budgets)):
        single[part] = None
        if file is not None:
            try:
                single[part] = _read_text(file)
            except ConfigError as exc:
                issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    return ConfigBundle(parts["regions"], parts["policies"], single["keys"], single["budgets"])


def files_identity(sources: ConfigSources) -> Identity:
    """(path, (mtime, size, inode)) of every config file: changes when one is edited, added,
    removed or swapped (a symlink to a new file)."""
    paths: list[Path] = []
    for directory in (sources.regions_dir, sources.policies_dir):
        paths.append(directory)
        if directory.is_dir():
            paths.extend(_yaml_files(directory))
    paths.extend(path for path in (sources.keys, sources.budgets, sources.signature) if path is not None)
    out: list[tuple[str, tuple[int, int, int] | None]] = []
    for path in paths:
        try:
            stat = os.stat(path)
        except OSError:
            out.append((str(path), None))
            continue
        # A folder's own mtime changes with its entries; a file's with its content.
        out.append((str(path), (stat.st_mtime_ns, stat.st_size, stat.st_ino)))
    return tuple(out)


def _safe_name(name: str) -> bool:
    return (name.endswith(YAML_SUFFIXES) and "/" not in name and "\\" not in name and not name.startswith(".")
            and name == os.path.basename(name) and 0 < len(name) <= 255)


def _budget_issues(exc: BudgetError, file: str) -> list[ConfigIssue]:
    """``BudgetError``'s "file: field: message (got value)" lines as issues."""
    issues = []
    for text in exc.issues:
        rest = text.removeprefix(f"{file}: ")
        name, sep, message = rest.partition(": ")
        if not sep or name.startswith("not valid YAML"):
            issues.append(ConfigIssue(file, "", rest))
        else:
            issues.append(ConfigIssue(file, name, message))
    return issues


def validate_bundle(bundle: ConfigBundle, policy_name: str, parts: frozenset[str],
                    shown: Mapping[str, str], ticket_keys: TicketKeyRing | None = None,
                    ticket_keys_file: str = "--ticket-keys", keys_in_use: KeyRing | None = None) -> LoadedConfig:
    """The bundle checked as the router's start checks its files; ``ConfigError`` lists every
    problem, each naming its file as ``shown`` (part -> the name to show: a path, a store
    version), its field and its value. ``parts``: those this router uses. ``keys_in_use``: the
    key ring the bundle would replace (it may not take the last admin key away)."""
    from scheduler.plugins import load_checked_fleet

    issues: list[ConfigIssue] = []
    for part in ("keys", "budgets"):
        if part in parts and getattr(bundle, part) is None:
            issues.append(ConfigIssue(shown[part], "", f"no {part} file in this version, and this router uses one "
                                                       f"(a version cannot turn {part} off)"))
    with tempfile.TemporaryDirectory(prefix="scheduler-config-") as tmp:
        root = Path(tmp)
        where = {"regions": root / "regions", "policies": root / "policies", "keys": root / "keys.yaml",
                 "budgets": root / "budgets.yaml"}

        def rename(text: str) -> str:
            for part in PARTS:
                text = text.replace(str(where[part]), shown[part])
            return text

        for part in ("regions", "policies"):
            where[part].mkdir()
            for name, text in getattr(bundle, part).items():
                if not _safe_name(name):
                    issues.append(ConfigIssue(shown[part], "", f"file name {name[:80]!r} is not a plain *.yaml name"))
                    continue
                (where[part] / name).write_text(text, encoding="utf-8")
        regions: tuple[RegionConfig, ...] = ()
        policies: Mapping[str, PolicyConfig] = {}
        policy: PolicyConfig | None = None
        try:
            fleet = load_checked_fleet(where["regions"], where["policies"])
            regions, policies = fleet.regions, fleet.policies
            policy = fleet.policy(policy_name)
        except ConfigError as exc:
            issues.extend(exc.issues)
        if ticket_keys is not None and regions:
            for region in regions:
                if region.tickets_enforced and region.name not in ticket_keys.regions:
                    issues.append(ConfigIssue(shown["regions"], "name", f"region {region.name!r} has no dispatch-ticket "
                                              f"keys in {ticket_keys_file} (the ticket keys are not reloaded: add them "
                                              "with `scheduler tickets keygen --rotate` and restart)"))
        keys: KeyRing | None = None
        if "keys" in parts and bundle.keys is not None:
            where["keys"].write_text(bundle.keys, encoding="utf-8")
            try:
                keys = KeyRing.load(where["keys"])
            except ConfigError as exc:
                issues.extend(exc.issues)
            else:
                issues.extend(key_ring_issues(keys, str(where["keys"]), keys_in_use))
        budgets: Mapping[str, TenantBudget] | None = None
        if "budgets" in parts and bundle.budgets is not None:
            where["budgets"].write_text(bundle.budgets, encoding="utf-8")
            try:
                budgets = load_budgets(where["budgets"])
            except BudgetError as exc:
                issues.extend(_budget_issues(exc, str(where["budgets"])))
        if issues:
            raise ConfigError(ConfigIssue(rename(i.file), i.field, rename(i.message)) for i in issues)
    assert policy is not None
    return LoadedConfig(bundle, regions, policies, policy, keys, budgets)


def load_local(sources: ConfigSources, ticket_keys: TicketKeyRing | None = None,
               ticket_keys_file: str = "--ticket-keys", keys_in_use: KeyRing | None = None) -> LoadedConfig:
    """This router's files, read and validated (``ConfigError`` naming each problem)."""
    return validate_bundle(read_bundle(sources), sources.policy, sources.parts, sources.shown(), ticket_keys,
                           ticket_keys_file, keys_in_use)


# --- the store's versions ----------------------------------------------------------------


@dataclass(frozen=True)
class PublishedConfig:
    """One version as the store holds it."""

    counter: int
    bundle: ConfigBundle
    published_by: str
    published_at: float
    trigger: str
    # The operator's signature of the bundle (None: unsigned; adopted only where allowed).
    signature: BundleSignature | None = None

    @property
    def version(self) -> ConfigVersion:
        return ConfigVersion(self.counter, self.bundle.digest)

    @property
    def signed_at(self) -> float:
        return self.signature.signed_at if self.signature is not None else 0.0

    @property
    def fingerprint(self) -> str:
        """The bundle and its signature, whatever counter it was written under: one refusal
        is logged once however often the same record is written again."""
        signed = self.signature.value.hex() if self.signature is not None else "unsigned"
        return f"{self.bundle.digest}:{signed}"

    def to_bytes(self) -> bytes:
        return json.dumps({"counter": self.counter, "digest": self.bundle.digest, "bundle": self.bundle.to_dict(),
                           "published_by": self.published_by, "published_at": self.published_at,
                           "trigger": self.trigger,
                           "signature": self.signature.to_dict() if self.signature is not None else None},
                          ensure_ascii=False).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> PublishedConfig:
        """``BundleRefused`` (a ValueError) when ``raw`` is not a version record (reason
        ``malformed``) or its hash does not match its files (``digest_mismatch``)."""
        if len(raw) > MAX_BUNDLE_BYTES:
            raise BundleRefused(MALFORMED, f"record of {len(raw):,} bytes, more than {MAX_BUNDLE_BYTES:,}")
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BundleRefused(MALFORMED, f"not JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("counter"), int) or data["counter"] < 1:
            raise BundleRefused(MALFORMED, "expected an object with a positive integer counter")
        try:
            bundle = ConfigBundle.from_dict(data.get("bundle"))
            signature = (None if data.get("signature") is None
                         else BundleSignature.from_dict(data["signature"], "signature"))
        except ValueError as exc:  # SigningError too
            raise BundleRefused(MALFORMED, str(exc)) from None
        if data.get("digest") != bundle.digest:
            raise BundleRefused(DIGEST_MISMATCH, f"the record's digest {str(data.get('digest'))[:16]!r} does not "
                                                   f"match its files' {bundle.digest[:16]}")
        at = data.get("published_at")
        return cls(data["counter"], bundle, str(data.get("published_by", "")),
                   float(at) if isinstance(at, int | float) else 0.0, str(data.get("trigger", "")), signature)


@dataclass(frozen=True)
class Head:
    counter: int
    digest: str

    def to_bytes(self) -> bytes:
        return json.dumps({"counter": self.counter, "digest": self.digest}).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> Head:
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if (not isinstance(data, dict) or not isinstance(data.get("counter"), int)
                or not isinstance(data.get("digest"), str)):
            raise ValueError(f"expected {{counter, digest}}, got {str(data)[:80]}")
        return cls(data["counter"], data["digest"])


def _log_refused(key: str, refused: BundleRefused, fingerprint: str) -> None:
    log.warning("ignoring config record %s (%s): %s", key, refused.reason, refused.message)


@dataclass
class ConfigStore:
    """The versions in the shared store (any ``StateStore``; every call may raise
    ``StateUnavailable``). Records that do not parse are skipped and reported once each to
    ``refused`` (key, why, a fingerprint of the record)."""

    store: StateStore
    refused: Callable[[str, BundleRefused, str], None] = _log_refused
    _bad: dict[str, str] = field(default_factory=dict, init=False, repr=False)

    def _skip(self, key: str, raw: bytes, refused: BundleRefused) -> None:
        fingerprint = hashlib.sha256(raw).hexdigest()
        if self._bad.get(key) != fingerprint:
            self.refused(key, refused, fingerprint)
        self._bad[key] = fingerprint

    def _decode(self, key: str, raw: bytes | None) -> PublishedConfig | None:
        if raw is None:
            return None
        try:
            record = PublishedConfig.from_bytes(raw)
        except BundleRefused as exc:
            self._skip(key, raw, exc)
            return None
        self._bad.pop(key, None)
        return record

    def _head(self, raw: bytes | None) -> Head | None:
        if raw is None:
            return None
        try:
            return Head.from_bytes(raw)
        except ValueError as exc:
            self._skip(HEAD_KEY, raw, BundleRefused(MALFORMED, str(exc)))
            return None

    async def head(self) -> Head | None:
        return self._head(await self.store.get(HEAD_KEY))

    async def get(self, counter: int) -> PublishedConfig | None:
        key = version_key(counter)
        return self._decode(key, await self.store.get(key))

    async def newest(self, known: int) -> tuple[Head | None, PublishedConfig | None]:
        """The head, and the newest version after ``known`` (None: none newer). One read in
        the common case (nothing new): the head and version ``known + 1``."""
        raw_head, raw_next = await self.store.mget([HEAD_KEY, version_key(known + 1)])
        head = self._head(raw_head)
        best = self._decode(version_key(known + 1), raw_next)
        if head is not None and head.counter > max(known, best.counter if best else 0):
            best = await self.get(head.counter) or best
        if best is None:
            return head, None
        # A head two racing publishers left behind: walk on to the last version claimed.
        for _ in range(KEEP_VERSIONS):
            after = await self.get(best.counter + 1)
            if after is None:
                break
            best = after
        return head, best

    async def published_before(self, digest: str) -> bool:
        return await self.store.get(digest_key(digest)) is not None

    async def publish(self, bundle: ConfigBundle, after: int, by: str, at: float, trigger: str,
                      signature: BundleSignature | None = None) -> PublishedConfig:
        """Claim the next counter (after the head's and ``after``) for ``bundle`` and move the head."""
        head = await self.head()
        counter = max(after, head.counter if head is not None else 0) + 1
        for _ in range(MAX_CLAIMS):
            record = PublishedConfig(counter, bundle, by, at, trigger, signature)
            if await self.store.set_nx(version_key(counter), record.to_bytes(), FOREVER_S):
                break
            counter += 1
        else:
            raise StateUnavailable(f"could not claim a config version after {MAX_CLAIMS} tries (counter {counter})")
        await self.store.set(HEAD_KEY, Head(counter, bundle.digest).to_bytes())
        await self.store.set_nx(digest_key(bundle.digest), str(counter).encode(), FOREVER_S)
        if counter > KEEP_VERSIONS:
            await self.store.delete(version_key(counter - KEEP_VERSIONS))
        return record

    async def repair(self, record: PublishedConfig) -> None:
        """Put ``record`` back as the head (the store lost it, or a racing publisher left the
        head behind it)."""
        await self.store.set_nx(version_key(record.counter), record.to_bytes(), FOREVER_S)
        await self.store.set(HEAD_KEY, Head(record.counter, record.bundle.digest).to_bytes())
        await self.store.set_nx(digest_key(record.bundle.digest), str(record.counter).encode(), FOREVER_S)


# --- the reloader ------------------------------------------------------------------------


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
    start it after the router's other parts; see the module's docstring)."""

    deps: RouterDeps
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
                return ReloadOutcome(True, False, previous, previous, digest, source=self.source, published=published)
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
        from scheduler.datalayer.carbon.pollers import CarbonPollers
        from scheduler.datalayer.probes import RegionProbes
        from scheduler.ledger.service import LedgerService

        deps = self.deps
        refresher = deps.refresher
        old = self.current
        previous = self.version.label
        regions_changed = loaded.regions != old.regions
        if regions_changed or loaded.policy != old.policy:
            was = refresher.builder
            builder = SnapshotBuilder(loaded.regions, loaded.policy, energy_model=was.energy_model, perf=was.perf,
                                      config_version=version.label)
        else:
            builder = refresher.builder
            builder.config_version = version.label
        probes, old_probes = refresher.probes, None
        if probes is not None and regions_changed:
            old_probes = probes
            probes = RegionProbes.of(loaded.regions, clock=probes.clock, interval_s=probes.interval_s,
                                     timeout_s=probes.timeout_s)
            await probes.probe_all()
            await probes.start()
            refresher.probes = probes
        if deps.canary is not None:
            # The policy's canary arm is looked up in the new policies (scheduler.canary).
            deps.canary.use_policies(loaded.policies)
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
                fresh = CarbonPollers.from_regions(loaded.regions, deps.store, counters=pollers.counters)
                pollers.pollers, pollers.providers = fresh.pollers, fresh.providers
                await pollers.start()
        log.warning("config version %s in use (%s; was %s): %s", version.label, trigger if trigger != "store"
                    else source, previous, _summary(old, loaded))

    # --- metrics and lifecycle --------------------------------------------------------

    def samples(self) -> list[tuple[str, Mapping[str, str], float]]:
        out: list[tuple[str, Mapping[str, str], float]] = [
            ("scheduler_config_version_info", {"version": self.version.label, "source": self.source}, 1.0),
            ("scheduler_config_version_counter", {}, float(self.version.counter)),
            ("scheduler_config_last_reload_ok", {}, 0.0 if self.problems else 1.0),
            ("scheduler_config_unpublished", {}, 1.0 if self._record is None else 0.0),
        ]
        for (trigger, result), count in sorted(self.counts.items()):
            out.append(("scheduler_config_reloads_total", {"trigger": trigger, "result": result}, float(count)))
        # Every reason from the start (at 0): an alert's increase() sees the first refusal.
        for reason in (*SIGNATURE_REASONS, INVALID):
            out.append(("scheduler_config_rejected_total", {"reason": reason}, float(self.rejected[reason])))
        signature = self._signature
        out.append(("scheduler_config_signed", {"key_id": signature.key_id if signature is not None else ""},
                    1.0 if signature is not None else 0.0))
        for issue in self.problems[:MAX_PROBLEM_SAMPLES]:
            out.append(("scheduler_config_problem",
                        {"file": issue.file, "field": issue.field, "message": issue.message[:200]}, 1.0))
        return out

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
        while True:
            await asyncio.sleep(self.sync_interval_s)
            try:
                await self.sync()
            except Exception:
                log.exception("config sync failed; version %s stays in use", self.version.label)

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(self.watch_interval_s)
            identity = await asyncio.to_thread(files_identity, self.sources)
            if identity != self._seen:
                self._seen = identity
                try:
                    await self.reload("file-change", only_if_changed=True)
                except Exception:
                    log.exception("config reload failed; version %s stays in use", self.version.label)


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
