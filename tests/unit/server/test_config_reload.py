"""Hot reload (scheduler.server.config_reload): validation names file, field and value; a bad
bundle keeps the version in use; versions in the store (claims, the head, the start-up rule,
an outage); what a version swaps in the router."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scheduler.config.compile import compile_fleet, compile_policy
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS, ConfigError
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.server.app import RouterDeps, build_deps, with_services
from scheduler.server.auth import create_key
from scheduler.server.config_reload.metrics import config_samples
from scheduler.server.config_reload.reloader import ConfigReloader
from scheduler.server.config_reload.sources import ConfigBundle, ConfigSources, ConfigVersion, load_local, validate_bundle
from scheduler.server.config_reload.store import ConfigStore, PublishedConfig, version_key
from scheduler.server.config_signing import ConfigTrust
from scheduler.state.memory_store import MemoryStore
from scheduler.state.store import StateUnavailable
from scheduler.tickets import TicketKeyRing

REGIONS = ("eu-north", "eu-central", "us-east")


def make_config(root: Path, *, keys: bool = False, budgets: bool = False) -> ConfigSources:
    regions, policies = root / "regions", root / "policies"
    regions.mkdir(parents=True)
    policies.mkdir()
    for name in REGIONS:
        shutil.copy(EMBEDDED_REGIONS / f"{name}.yaml", regions)
    for path in EMBEDDED_POLICIES.glob("*.yaml"):
        shutil.copy(path, policies)
    keys_file = budgets_file = None
    if keys:
        keys_file = root / "keys.yaml"
        keys_file.write_text(yaml.safe_dump({"keys": [create_key("acme").entry_dict()]}))
    if budgets:
        budgets_file = root / "budgets.yaml"
        budgets_file.write_text("tenants:\n  acme: {soft_kwh: 800, hard_kwh: 1000}\n")
    return ConfigSources(regions, policies, "default", keys_file, budgets_file)


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


@dataclass
class DownStore(MemoryStore):
    """A memory store that is unreachable while ``down`` is set."""

    down: bool = False

    def _check(self) -> None:
        if self.down:
            raise StateUnavailable("test: the store is down")

    async def get(self, key: str) -> bytes | None:
        self._check()
        return await super().get(key)

    async def mget(self, keys_: Sequence[str]) -> list[bytes | None]:
        self._check()
        return await super().mget(keys_)

    async def set(self, key: str, value: bytes, ttl_s: float | None = None) -> None:
        self._check()
        await super().set(key, value, ttl_s)

    async def set_nx(self, key: str, value: bytes, ttl_s: float) -> bool:
        self._check()
        return await super().set_nx(key, value, ttl_s)


# The versions' mechanics, without signatures (tests/unit/server/test_config_signing.py has them).
UNSIGNED = ConfigTrust(allow_unsigned=True)


def router(sources: ConfigSources, store: MemoryStore, *, budgets: bool = False,
           ticket_keys: TicketKeyRing | None = None, trust: ConfigTrust = UNSIGNED) -> tuple[RouterDeps, ConfigReloader]:
    loaded = load_local(sources, ticket_keys)
    deps = build_deps(SnapshotBuilder(compile_fleet(loaded.regions),
                                      compile_policy(loaded.policy)), store, "memory", keys=loaded.keys)
    if budgets:
        with_services(deps, carbon_pollers=False, budgets=loaded.budgets)
    reloader = ConfigReloader(deps, sources, loaded, ticket_keys=ticket_keys, trust=trust, watch_interval_s=0)
    deps.config = reloader
    return deps, reloader


# --- validation --------------------------------------------------------------------------


def test_a_broken_policy_is_named_by_file_field_and_value(tmp_path: Path) -> None:
    sources = make_config(tmp_path)
    edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: soon")
    with pytest.raises(ConfigError) as caught:
        load_local(sources)
    (issue,) = caught.value.issues
    assert issue.file == str(sources.policies_dir / "default.yaml")
    assert issue.field == "max_age.region_state"
    assert "'soon'" in issue.message


def test_every_part_is_checked_and_every_problem_reported(tmp_path: Path) -> None:
    sources = make_config(tmp_path, keys=True, budgets=True)
    edit(sources.regions_dir / "eu-north.yaml", "pue: 1.1", "pue: 9")
    assert sources.keys is not None and sources.budgets is not None
    sources.keys.write_text("keys:\n  - {id: nothex}\n")
    sources.budgets.write_text("tenants:\n  acme: {soft_kwh: -1}\n")
    with pytest.raises(ConfigError) as caught:
        load_local(sources)
    found = {(issue.file, issue.field) for issue in caught.value.issues}
    assert (str(sources.regions_dir / "eu-north.yaml"), "pue") in found
    assert (str(sources.keys), "keys[0].id") in found
    assert (str(sources.budgets), "tenants.acme.soft_kwh") in found
    budget = next(i for i in caught.value.issues if i.file == str(sources.budgets))
    assert "-1" in budget.message
    # No temporary path leaks into a message.
    assert not any("scheduler-config-" in f"{i.file} {i.message}" for i in caught.value.issues)


def test_an_unknown_policy_name_and_a_region_without_ticket_keys_are_problems(tmp_path: Path) -> None:
    sources = make_config(tmp_path)
    bundle = load_local(sources).bundle
    tickets = TicketKeyRing.generate(["eu-north", "eu-central"])
    with pytest.raises(ConfigError) as caught:
        validate_bundle(bundle, "no-such-policy", sources.parts, sources.shown(), tickets)
    messages = [str(issue) for issue in caught.value.issues]
    assert any("no policy named 'no-such-policy'" in m for m in messages)
    assert any("'us-east' has no dispatch-ticket keys" in m for m in messages)


def test_a_version_without_a_part_this_router_uses_is_refused(tmp_path: Path) -> None:
    sources = make_config(tmp_path, keys=True)
    bundle = load_local(sources).bundle
    without_keys = ConfigBundle(bundle.regions, bundle.policies, None, None)
    shown = {part: f"store:7-abc/{part}" for part in ("regions", "policies", "keys", "budgets")}
    with pytest.raises(ConfigError) as caught:
        validate_bundle(without_keys, "default", sources.parts, shown)
    assert [i.file for i in caught.value.issues] == ["store:7-abc/keys"]


def test_file_names_from_the_store_cannot_escape(tmp_path: Path) -> None:
    sources = make_config(tmp_path)
    bundle = load_local(sources).bundle
    hostile = ConfigBundle({**bundle.regions, "../../evil.yaml": "x: 1"}, bundle.policies)
    with pytest.raises(ConfigError) as caught:
        validate_bundle(hostile, "default", sources.parts, sources.shown())
    assert "is not a plain *.yaml name" in str(caught.value)


def test_the_digest_is_the_content_and_the_label_its_version(tmp_path: Path) -> None:
    first = make_config(tmp_path / "a")
    second = make_config(tmp_path / "b")  # other paths, same files
    digest = load_local(first).bundle.digest
    assert digest == load_local(second).bundle.digest and len(digest) == 64
    edit(second.policies_dir / "default.yaml", "region_state: 5s", "region_state: 6s")
    assert load_local(second).bundle.digest != digest
    assert ConfigVersion(0, digest).label == f"local-{digest[:12]}"
    assert ConfigVersion(7, digest).label == f"7-{digest[:12]}"


# --- the store ---------------------------------------------------------------------------


async def test_versions_are_claimed_once_and_the_newest_is_found(tmp_path: Path) -> None:
    bundle = load_local(make_config(tmp_path)).bundle
    store = ConfigStore(MemoryStore())
    one = await store.publish(bundle, 0, "a", 1.0, "test")
    assert one.counter == 1
    # Someone claimed 2 without moving the head (a racing publisher): the next claim is 3.
    await store.store.set_nx(version_key(2), PublishedConfig(2, bundle, "b", 2.0, "test").to_bytes(), 60)
    three = await store.publish(bundle, 1, "c", 3.0, "test")
    assert three.counter == 3
    # A head left behind by the race: readers still find the newest.
    await store.store.set("config:head", b'{"counter": 1, "digest": "x"}')
    head, newest = await store.newest(0)
    assert head is not None and head.counter == 1
    assert newest is not None and newest.counter == 3 and newest.published_by == "c"
    assert (await store.newest(3))[1] is None


async def test_a_malformed_record_is_skipped(tmp_path: Path) -> None:
    bundle = load_local(make_config(tmp_path)).bundle
    store = ConfigStore(MemoryStore())
    record = await store.publish(bundle, 0, "a", 1.0, "test")
    tampered = record.to_bytes().replace(b'"trigger"', b'"trigger2"').replace(bundle.digest.encode(), b"0" * 64)
    await store.store.set(version_key(2), tampered)
    _, newest = await store.newest(1)
    assert newest is None


# --- the reloader ------------------------------------------------------------------------


async def test_a_bad_reload_keeps_the_version_and_a_good_one_changes_routing(tmp_path: Path) -> None:
    sources = make_config(tmp_path)
    deps, reloader = router(sources, MemoryStore())
    await deps.refresher.start()
    await reloader.start()
    try:
        first = reloader.version
        assert first.counter == 1  # the store had none: published at start
        assert deps.refresher.current().config_version == first.label

        edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: soon")
        bad = await reloader.reload("test")
        assert not bad.ok and not bad.changed and bad.version == first.label
        assert [(p.file, p.field) for p in bad.problems] == [(str(sources.policies_dir / "default.yaml"),
                                                              "max_age.region_state")]
        assert deps.refresher.current().config_version == first.label
        problems = [s for s in config_samples(reloader) if s[0] == "scheduler_config_problem"]
        assert problems and problems[0][1]["field"] == "max_age.region_state"

        edit(sources.policies_dir / "default.yaml", "region_state: soon", "region_state: 7s")
        good = await reloader.reload("test")
        assert good.ok and good.changed and good.published and good.previous_version == first.label
        snapshot = deps.refresher.current()
        assert snapshot.config_version == good.version and good.version.startswith("2-")
        assert snapshot.policy.max_age.region_state == 7.0
        assert not [s for s in config_samples(reloader) if s[0] == "scheduler_config_problem"]

        again = await reloader.reload("test")
        assert again.ok and not again.changed and again.version == good.version

        # Regions: one removed; the snapshot's candidates follow.
        (sources.regions_dir / "us-east.yaml").unlink()
        removed = await reloader.reload("test")
        assert removed.changed
        assert {r.name for r in deps.refresher.current().regions} == {"eu-north", "eu-central"}
    finally:
        await reloader.stop()
        await deps.refresher.stop()


async def test_keys_and_budgets_are_swapped(tmp_path: Path) -> None:
    sources = make_config(tmp_path, keys=True, budgets=True)
    deps, reloader = router(sources, MemoryStore(), budgets=True)
    await reloader.start()
    try:
        new = create_key("globex", admin=True)
        assert sources.keys is not None and sources.budgets is not None
        sources.keys.write_text(yaml.safe_dump({"keys": [new.entry_dict()]}))
        sources.budgets.write_text("tenants:\n  globex: {hard_kwh: 5}\n")
        outcome = await reloader.reload("test")
        assert outcome.changed
        assert deps.keys is not None and deps.keys.authenticate(f"Bearer {new.key}").tenant == "globex"
        from scheduler.ledger.service import LedgerService
        (ledger,) = [t for t in deps.background if isinstance(t, LedgerService)]
        assert set(ledger.ledger.budgets) == {"globex"}
    finally:
        await reloader.stop()


async def test_a_second_router_adopts_the_published_version(tmp_path: Path) -> None:
    store = MemoryStore()
    a_sources = make_config(tmp_path / "a")
    b_sources = make_config(tmp_path / "b")
    a_deps, a = router(a_sources, store)
    b_deps, b = router(b_sources, store)

    def a_deps_policy(reloader: ConfigReloader) -> float:
        return a_deps.refresher.current().policy.max_age.region_state

    await a.start()
    await b.start()  # same files: the same version
    try:
        assert a.version == b.version and a.version.counter == 1
        edit(a_sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 9s")
        outcome = await a.reload("test")
        assert outcome.changed
        await b.sync()
        assert b.version.label == outcome.version
        assert b_deps.refresher.current().policy.max_age.region_state == 9.0
        assert b.source.startswith("store (published by ")

        # SIGHUP or a touched file on B: its files did not change, they do not revert the fleet.
        kept = await b.reload("SIGHUP", only_if_changed=True)
        assert kept.ok and not kept.changed and kept.version == outcome.version
        # The RPC publishes them (a rollback to B's files), then A's files again.
        rolled_back = await b.reload("rpc")
        assert rolled_back.changed and rolled_back.version.startswith("3-")
        await a.sync()
        assert a.version.label == rolled_back.version
        assert a_deps_policy(a) == 5.0
        again = await a.reload("rpc")
        await b.sync()
        assert b.version.label == again.version and again.version.startswith("4-")

        # A version B cannot validate (a region without ticket keys there) is not adopted by B.
        b.ticket_keys = TicketKeyRing.generate(REGIONS)
        shutil.copy(EMBEDDED_REGIONS / "us-west.yaml", a_sources.regions_dir)
        refused = await a.reload("test")
        await b.sync()
        assert b.version.label == again.version != refused.version
        assert any("'us-west' has no dispatch-ticket keys" in str(p) for p in b.problems)
        assert b.problems[0].file.startswith(f"store:{refused.version}/")
    finally:
        await a.stop()
        await b.stop()


async def test_at_start_old_files_join_the_fleet_and_new_files_are_published(tmp_path: Path) -> None:
    store = MemoryStore()
    a_sources = make_config(tmp_path / "a")
    _, a = router(a_sources, store)
    await a.start()
    old_digest = a.version.digest
    edit(a_sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 9s")
    newer = await a.reload("test")
    await a.stop()

    # A replica restarting on the old files: it adopts the fleet's version, it does not revert it.
    old_sources = make_config(tmp_path / "old")
    old_deps, old = router(old_sources, store)
    assert old.version.digest == old_digest
    await old.start()
    assert old.version.label == newer.version
    assert old_deps.refresher.current().policy.max_age.region_state == 9.0
    await old.stop()

    # A rollout with files never published: they become the fleet's version.
    new_sources = make_config(tmp_path / "new")
    edit(new_sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 4s")
    _, new = router(new_sources, store)
    await new.start()
    assert new.version.counter == 3
    await new.stop()


async def test_while_the_store_is_down_a_reload_applies_locally_and_is_published_later(tmp_path: Path) -> None:
    store = DownStore()
    sources = make_config(tmp_path)
    deps, reloader = router(sources, store)
    store.down = True
    await reloader.start()  # starts on its own files, unpublished
    try:
        assert reloader.version.counter == 0
        edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 8s")
        outcome = await reloader.reload("test")
        assert outcome.changed and not outcome.published and "unreachable" in outcome.publish_error
        assert outcome.version.startswith("local-")
        assert deps.refresher.current().config_version == outcome.version
        assert deps.refresher.current().policy.max_age.region_state == 8.0
        # A second reload of the same files (the operator's RPC after the file watcher's) changes
        # nothing and still says the version in use waits for the store.
        again = await reloader.reload("rpc")
        assert not again.changed and not again.published and again.publish_error == outcome.publish_error

        store.down = False
        await reloader.sync()
        assert reloader.version.counter == 1
        settled = await reloader.reload("rpc")
        assert not settled.changed and settled.published and settled.publish_error == ""
        assert deps.refresher.current().config_version == reloader.version.label
        head = await ConfigStore(store).head()
        assert head is not None and head.digest == reloader.version.digest
    finally:
        await reloader.stop()


async def test_a_lost_head_is_put_back(tmp_path: Path) -> None:
    store = MemoryStore()
    _, reloader = router(make_config(tmp_path), store)
    await reloader.start()
    try:
        for key in await store.keys("config:"):
            await store.delete(key)  # a Redis restart without persistence
        await reloader.sync()
        head = await ConfigStore(store).head()
        assert head is not None and head.counter == reloader.version.counter == 1
    finally:
        await reloader.stop()


async def test_new_regions_get_probes_and_carbon_pollers(tmp_path: Path) -> None:
    from scheduler.datalayer.carbon.carbon_pollers import CarbonPollers

    sources = make_config(tmp_path)
    loaded = load_local(sources)
    store = MemoryStore()
    # A shared-store router: it probes its regions and polls their carbon zones.
    deps = build_deps(SnapshotBuilder(compile_fleet(loaded.regions), compile_policy(loaded.policy)), store, "redis")
    with_services(deps)
    reloader = ConfigReloader(deps, sources, loaded, trust=UNSIGNED, watch_interval_s=0)
    (pollers,) = [t for t in deps.background if isinstance(t, CarbonPollers)]
    await deps.refresher.start()
    await pollers.start()
    await reloader.start()
    try:
        (sources.regions_dir / "us-east.yaml").unlink()
        shutil.copy(EMBEDDED_REGIONS / "us-west.yaml", sources.regions_dir)
        outcome = await reloader.reload("test")
        assert outcome.changed
        probes = deps.refresher.probes
        assert probes is not None and set(probes.endpoints) == {"eu-north", "eu-central", "us-west"}
        assert set(probes.results()) == set(probes.endpoints)  # probed before the swap
        zones = {p.zone for p in pollers.pollers}
        assert "US-CAL-CISO" in zones and "US-MIDA-PJM" not in zones
        assert {r.name for r in deps.refresher.current().regions} == {"eu-north", "eu-central", "us-west"}
    finally:
        await reloader.stop()
        await pollers.stop()
        await deps.refresher.stop()
