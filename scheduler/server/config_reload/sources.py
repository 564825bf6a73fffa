"""What a config version is made of: where this router's files are (``ConfigSources``), the files
read into one bundle (``ConfigBundle``, hashed), a version's label (``ConfigVersion``) and a bundle
validated as the router's start validates its files (``LoadedConfig``)."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from scheduler.config.compile import compile_fleet
from scheduler.config.loader import ConfigError, ConfigIssue
from scheduler.config.schema import PolicyConfig, RegionConfig
from scheduler.ledger.budget import BudgetError, TenantBudget, load_budgets
from scheduler.server.auth import KeyRing, key_ring_issues
from scheduler.tickets import TicketKeyRing

PARTS = ("regions", "policies", "keys", "budgets")
YAML_SUFFIXES = (".yaml", ".yml")

Identity = tuple[tuple[str, tuple[int, int, int] | None], ...]


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
    from scheduler.plugins.checked_fleet import load_checked_fleet

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
            for region in compile_fleet(regions).regions:
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
