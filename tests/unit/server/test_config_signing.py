"""Signed config (scheduler.server.config_signing, scheduler.server.config_reload): a router
adopts from the store only versions signed by a key it trusts; whoever writes the store cannot
add an admin key, move a region's endpoint, replay an old version or empty the key ring."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scheduler.server.app import RouterDeps
from scheduler.server.auth import NewKey, create_key
from scheduler.server.config_reload.metrics import config_samples
from scheduler.server.config_reload.reloader import ConfigReloader
from scheduler.server.config_reload.sources import ConfigBundle, ConfigSources, read_bundle
from scheduler.server.config_reload.store import ConfigStore, PublishedConfig, version_key
from scheduler.server.config_signing import (
    BundleRefused,
    BundleSignature,
    ConfigTrust,
    SigningError,
    SigningKey,
)
from scheduler.state.memory_store import MemoryStore
from tests.unit.server.test_config_reload import edit, make_config, router

OPS_1 = SigningKey.generate("ops-1")
OPS_2 = SigningKey.generate("ops-2")
# Someone's own key under the operator's key id, and a key nobody trusts.
FORGER = SigningKey.generate("ops-1")
STRANGER = SigningKey.generate("mallory")
ADMIN = create_key("ops", admin=True)
TENANT = create_key("acme")
EVIL_ADMIN = create_key("mallory", admin=True)
EU_NORTH = "http://127.0.0.1:8000/eu-north"
ATTACKER_HOST = "http://attacker.example:8000/eu-north"


def trust(*keys: SigningKey) -> ConfigTrust:
    return ConfigTrust({k.key_id: k.private.public_key() for k in keys}, source="trust.yaml")


def keys_text(*keys: NewKey) -> str:
    return yaml.safe_dump({"keys": [k.entry_dict() for k in keys]})


def signed_config(root: Path, key: SigningKey | None = OPS_1, at: float = 1_000.0) -> ConfigSources:
    """Router files with an admin and a tenant key, and (``key``) their detached signature."""
    sources = make_config(root, keys=True)
    assert sources.keys is not None
    sources.keys.write_text(keys_text(ADMIN, TENANT))
    signature = root / "config.sig"
    if key is not None:
        sign_files(sources, key, signature, at)
    return ConfigSources(sources.regions_dir, sources.policies_dir, sources.policy, sources.keys, None, signature)


def sign_files(sources: ConfigSources, key: SigningKey, out: Path, at: float) -> BundleSignature:
    signature = key.sign(read_bundle(sources).digest, at)
    out.write_text(signature.to_text())
    return signature


def with_keys(bundle: ConfigBundle, *keys: NewKey) -> ConfigBundle:
    return ConfigBundle(bundle.regions, bundle.policies, keys_text(*keys), bundle.budgets)


def with_endpoint(bundle: ConfigBundle, endpoint: str) -> ConfigBundle:
    regions = dict(bundle.regions)
    assert EU_NORTH in regions["eu-north.yaml"]
    regions["eu-north.yaml"] = regions["eu-north.yaml"].replace(EU_NORTH, endpoint)
    return ConfigBundle(regions, bundle.policies, bundle.keys, bundle.budgets)


def endpoint(deps: RouterDeps) -> str:
    (region,) = [r for r in deps.refresher.current().regions if r.name == "eu-north"]
    return region.endpoint


def rejected(reloader: ConfigReloader) -> dict[str, float]:
    return {s[1]["reason"]: s[2] for s in config_samples(reloader) if s[0] == "scheduler_config_rejected_total"}


# --- the primitives ----------------------------------------------------------------------


def test_a_signature_verifies_only_for_its_key_and_digest() -> None:
    digest = "ab" * 32
    signature = OPS_1.sign(digest, 1_700_000_000.12345)
    assert signature.signed_at == 1_700_000_000.123
    trust(OPS_1).check(digest, signature)
    with pytest.raises(BundleRefused) as caught:
        trust(OPS_1).check("cd" * 32, signature)
    assert caught.value.reason == "digest_mismatch"
    forged = BundleSignature(signature.key_id, digest, signature.signed_at + 1, signature.value)
    with pytest.raises(BundleRefused) as caught:
        trust(OPS_1).check(digest, forged)
    assert caught.value.reason == "bad_signature"
    with pytest.raises(BundleRefused, match="'ops-1', which this router does not trust") as caught:
        trust(OPS_2).check(digest, signature)
    assert caught.value.reason == "unknown_key"
    with pytest.raises(BundleRefused, match="trusts no config key") as caught:
        ConfigTrust().check(digest, None)
    assert caught.value.reason == "unsigned"
    ConfigTrust(allow_unsigned=True).check(digest, None)


def test_key_files_round_trip_and_bad_ones_name_file_and_field(tmp_path: Path) -> None:
    key_file = tmp_path / "ops.key"
    key_file.write_text(OPS_1.to_text())
    loaded = SigningKey.load(key_file)
    assert loaded.key_id == "ops-1" and loaded.public_b64() == OPS_1.public_b64()
    trust_file = tmp_path / "trust.yaml"
    trust_file.write_text(f"keys:\n  ops-1: {OPS_1.public_b64()}\n  ops-2: {OPS_2.public_b64()}\n")
    assert set(ConfigTrust.load(trust_file).keys) == {"ops-1", "ops-2"}
    cases = {
        "keys: {}\n": r"trust.yaml: keys: the list is empty",
        "keys:\n  ops-1: bm90IGEga2V5\n": r"trust.yaml: keys.ops-1: expected 32 bytes, got 9",
        "keys:\n  'bad id!': x\n": r"trust.yaml: keys: expected a key id",
        "[1]\n": r"trust.yaml: expected a mapping with one key, 'keys'",
    }
    for text, message in cases.items():
        trust_file.write_text(text)
        with pytest.raises(SigningError, match=message):
            ConfigTrust.load(trust_file)
    key_file.write_text("key_id: ops-1\nprivate_key: not-base64@@\n")
    with pytest.raises(SigningError, match=r"ops.key: private_key: not base64"):
        SigningKey.load(key_file)


def test_the_private_key_comes_from_a_file_or_the_environment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "ops.key"
    key_file.write_text(OPS_2.to_text())
    monkeypatch.delenv("SCHEDULER_CONFIG_SIGNING_KEY", raising=False)
    monkeypatch.delenv("SCHEDULER_CONFIG_SIGNING_KEY_FILE", raising=False)
    with pytest.raises(SigningError, match="no signing key"):
        SigningKey.from_env_or_file(None)
    monkeypatch.setenv("SCHEDULER_CONFIG_SIGNING_KEY_FILE", str(key_file))
    assert SigningKey.from_env_or_file(None).key_id == "ops-2"
    monkeypatch.setenv("SCHEDULER_CONFIG_SIGNING_KEY", OPS_1.to_text())
    assert SigningKey.from_env_or_file(None).key_id == "ops-1"


# --- what an attacker who can write the store tries ----------------------------------------


@dataclass(frozen=True)
class Attack:
    name: str
    # (the version in use's record) -> the bytes the attacker writes as the next version
    record: Callable[[PublishedConfig], bytes]
    reason: str


def _next(record: PublishedConfig, bundle: ConfigBundle, signature: BundleSignature | None) -> bytes:
    return PublishedConfig(record.counter + 1, bundle, "attacker", 2_000.0, "evil", signature).to_bytes()


ATTACKS = [
    Attack("adds an admin key, unsigned",
           lambda r: _next(r, with_keys(r.bundle, ADMIN, TENANT, EVIL_ADMIN), None), "unsigned"),
    Attack("points eu-north at another host, signed by a forged ops-1",
           lambda r: _next(r, (b := with_endpoint(r.bundle, ATTACKER_HOST)), FORGER.sign(b.digest, 2_000.0)),
           "bad_signature"),
    Attack("points eu-north at another host under the version in use's signature",
           lambda r: _next(r, with_endpoint(r.bundle, ATTACKER_HOST), r.signature), "digest_mismatch"),
    Attack("adds an admin key, signed by a key nobody trusts",
           lambda r: _next(r, (b := with_keys(r.bundle, ADMIN, EVIL_ADMIN)), STRANGER.sign(b.digest, 2_000.0)),
           "unknown_key"),
    Attack("an empty key list, signed by the operator's key",
           lambda r: _next(r, (b := with_keys(r.bundle)), OPS_1.sign(b.digest, 2_000.0)), "invalid"),
    Attack("no admin key left, signed by the operator's key",
           lambda r: _next(r, (b := with_keys(r.bundle, TENANT)), OPS_1.sign(b.digest, 2_000.0)), "invalid"),
    Attack("the record's digest edited to match other files",
           lambda r: r.to_bytes().replace(f'"counter": {r.counter}'.encode(), f'"counter": {r.counter + 1}'.encode())
           .replace(b'"digest": "', b'"digest": "0', 1), "digest_mismatch"),
    Attack("not a record", lambda r: b'{"counter": 2, "bundle": "rm -rf"}', "malformed"),
    Attack("an old signed version replayed as the newest",
           lambda r: _next(r, with_keys(r.bundle, ADMIN, TENANT, EVIL_ADMIN),
                           OPS_1.sign(with_keys(r.bundle, ADMIN, TENANT, EVIL_ADMIN).digest, 500.0)), "rollback"),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
async def test_a_router_refuses_what_it_cannot_trust_and_keeps_its_version(
        attack: Attack, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    deps, reloader = router(signed_config(tmp_path), store, trust=trust(OPS_1))
    await reloader.start()
    try:
        first = reloader.version
        assert first.counter == 1  # its signed files, published at start
        in_use = await ConfigStore(store).get(1)
        assert in_use is not None and in_use.signature is not None and in_use.signature.key_id == "ops-1"

        # The attacker writes the next version and moves the head, as a publisher would.
        await store.set(version_key(2), attack.record(in_use))
        await store.set("config:head", json.dumps({"counter": 2, "digest": "f" * 64}).encode())
        with caplog.at_level(logging.ERROR, logger="scheduler.server.config_reload"):
            await reloader.sync()
            await reloader.sync()  # read again: still refused, counted and logged once

        assert reloader.version == first
        assert deps.refresher.current().config_version == first.label
        assert endpoint(deps) == EU_NORTH
        assert deps.keys is not None
        assert deps.keys.authenticate(f"Bearer {ADMIN.key}").admin
        with pytest.raises(Exception, match="unknown API key"):
            deps.keys.authenticate(f"Bearer {EVIL_ADMIN.key}")
        counts = rejected(reloader)
        assert counts[attack.reason] == 1 and sum(counts.values()) == 1, counts
        assert attack.reason in reloader.last_rejection
        assert ("scheduler_config_last_reload_ok", {}, 0.0) in config_samples(reloader)
        summaries = [r.message for r in caplog.records if "problem(s) in" in r.message]
        assert len(summaries) == 1 and attack.reason in summaries[0], summaries
    finally:
        await reloader.stop()


async def test_the_empty_key_list_names_the_reason(tmp_path: Path) -> None:
    store = MemoryStore()
    _, reloader = router(signed_config(tmp_path), store, trust=trust(OPS_1))
    await reloader.start()
    try:
        in_use = await ConfigStore(store).get(1)
        assert in_use is not None
        empty = with_keys(in_use.bundle)
        await ConfigStore(store).publish(empty, 1, "ops", 2_000.0, "publish", OPS_1.sign(empty.digest, 2_000.0))
        await reloader.sync()
        (problem,) = reloader.problems
        assert problem.file == "store:2-" + empty.digest[:12] + "/keys.yaml" and problem.field == "keys"
        assert "the list is empty: every call would be refused" in problem.message
    finally:
        await reloader.stop()


async def test_the_same_bad_bundle_under_new_counters_is_counted_each_time_and_logged_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryStore()
    _, reloader = router(signed_config(tmp_path), store, trust=trust(OPS_1))
    await reloader.start()
    try:
        in_use = await ConfigStore(store).get(1)
        assert in_use is not None
        evil = with_keys(in_use.bundle, ADMIN, EVIL_ADMIN)
        with caplog.at_level(logging.ERROR, logger="scheduler.server.config_reload"):
            for counter in (2, 3, 4):
                await ConfigStore(store).publish(evil, counter - 1, "attacker", 2_000.0, "evil")
                await reloader.sync()
        assert rejected(reloader)["unsigned"] == 3
        assert len([r for r in caplog.records if "problem(s) in" in r.message]) == 1
        assert reloader.version.counter == 1
    finally:
        await reloader.stop()


# --- what a trusted operator does -----------------------------------------------------------


async def test_a_correctly_signed_version_is_adopted(tmp_path: Path) -> None:
    store = MemoryStore()
    deps, reloader = router(signed_config(tmp_path), store, trust=trust(OPS_1))
    await reloader.start()
    try:
        in_use = await ConfigStore(store).get(1)
        assert in_use is not None
        moved = with_endpoint(in_use.bundle, "http://eu-north.internal:8000/eu-north")
        published = await ConfigStore(store).publish(moved, 1, "ops", 2_000.0, "publish",
                                                     OPS_1.sign(moved.digest, 2_000.0))
        await reloader.sync()
        assert reloader.version == published.version
        assert deps.refresher.current().config_version == published.version.label
        assert endpoint(deps) == "http://eu-north.internal:8000/eu-north"
        assert ("scheduler_config_signed", {"key_id": "ops-1"}, 1.0) in config_samples(reloader)
        assert sum(rejected(reloader).values()) == 0 and reloader.last_rejection == ""
    finally:
        await reloader.stop()


async def test_keys_rotate_with_two_trusted_keys(tmp_path: Path) -> None:
    store = MemoryStore()
    config = ConfigStore(store)
    # Step 1 of a rotation: routers trust the old key and the new one.
    deps, reloader = router(signed_config(tmp_path), store, trust=trust(OPS_1, OPS_2))
    await reloader.start()
    try:
        in_use = await config.get(1)
        assert in_use is not None
        by_old = with_endpoint(in_use.bundle, "http://a.internal:8000/eu-north")
        await config.publish(by_old, 1, "ops", 2_000.0, "publish", OPS_1.sign(by_old.digest, 2_000.0))
        await reloader.sync()
        assert endpoint(deps) == "http://a.internal:8000/eu-north" and reloader.version.counter == 2
        # Step 2: the new key signs.
        by_new = with_endpoint(in_use.bundle, "http://b.internal:8000/eu-north")
        await config.publish(by_new, 2, "ops", 3_000.0, "publish", OPS_2.sign(by_new.digest, 3_000.0))
        await reloader.sync()
        assert endpoint(deps) == "http://b.internal:8000/eu-north" and reloader.version.counter == 3
        assert ("scheduler_config_signed", {"key_id": "ops-2"}, 1.0) in config_samples(reloader)
    finally:
        await reloader.stop()

    # Step 3: routers restart trusting only the new key; the old one signs nothing they adopt.
    deps, reloader = router(signed_config(tmp_path / "restarted", key=None), store, trust=trust(OPS_2))
    await reloader.start()
    try:
        assert reloader.version.counter == 3 and endpoint(deps) == "http://b.internal:8000/eu-north"
        old_key = with_endpoint(in_use.bundle, ATTACKER_HOST)
        await config.publish(old_key, 3, "someone", 5_000.0, "publish", OPS_1.sign(old_key.digest, 5_000.0))
        await reloader.sync()
        assert rejected(reloader)["unknown_key"] == 1 and endpoint(deps) == "http://b.internal:8000/eu-north"
        assert "'ops-1', which this router does not trust (trust.yaml has: ops-2)" in reloader.last_rejection
    finally:
        await reloader.stop()


# --- the router's own files ---------------------------------------------------------------


async def test_signed_files_are_published_and_unsigned_ones_are_refused(tmp_path: Path) -> None:
    store = MemoryStore()
    sources = signed_config(tmp_path)
    assert sources.signature is not None
    _, reloader = router(sources, store, trust=trust(OPS_1))
    await reloader.start()
    try:
        assert reloader.version.counter == 1
        edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 7s")
        # The old signature does not cover the new files: refused, nothing published.
        refused = await reloader.reload("file-change", only_if_changed=True)
        assert not refused.ok and refused.version == reloader.version.label
        assert [p.file for p in refused.problems] == [str(sources.signature)]
        assert "the signature is for bundle" in refused.problems[0].message
        # A touch or a fleet-wide SIGHUP with unchanged files needs no signature.
        edit(sources.policies_dir / "default.yaml", "region_state: 7s", "region_state: 5s")
        assert (await reloader.reload("SIGHUP", only_if_changed=True)).ok

        edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 7s")
        sign_files(sources, OPS_1, sources.signature, 2_000.0)
        good = await reloader.reload("file-change", only_if_changed=True)
        assert good.ok and good.changed and good.published and good.version.startswith("2-")
        record = await ConfigStore(store).get(2)
        assert record is not None and record.signature is not None and record.signature.signed_at == 2_000.0

        # Files signed before the version in use: a rollback needs a fresh signature.
        edit(sources.policies_dir / "default.yaml", "region_state: 7s", "region_state: 6s")
        sign_files(sources, OPS_1, sources.signature, 1_500.0)
        older = await reloader.reload("rpc")
        assert not older.ok and older.problems[0].field == "signed_at"
        assert "sign these files again" in older.problems[0].message
    finally:
        await reloader.stop()


async def test_unsigned_files_run_until_the_store_has_a_signed_version(tmp_path: Path) -> None:
    store = MemoryStore()
    deps, reloader = router(signed_config(tmp_path, key=None), store, trust=trust(OPS_1))
    await reloader.start()
    try:
        assert reloader.version.counter == 0 and await ConfigStore(store).head() is None
        in_use = read_bundle(reloader.sources)
        moved = with_endpoint(in_use, "http://eu-north.internal:8000/eu-north")
        await ConfigStore(store).publish(moved, 0, "ops", 2_000.0, "publish", OPS_1.sign(moved.digest, 2_000.0))
        await reloader.sync()
        assert reloader.version.counter == 1 and endpoint(deps) == "http://eu-north.internal:8000/eu-north"
    finally:
        await reloader.stop()


async def test_without_trusted_keys_a_router_neither_adopts_nor_publishes(tmp_path: Path) -> None:
    store = MemoryStore()
    sources = signed_config(tmp_path)
    deps, reloader = router(sources, store, trust=ConfigTrust())
    await reloader.start()
    try:
        assert reloader.version.counter == 0 and await ConfigStore(store).head() is None
        # Its own reloads apply here and go nowhere.
        edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: 7s")
        outcome = await reloader.reload("rpc")
        assert outcome.changed and not outcome.published and "no --config-trust" in outcome.publish_error
        assert deps.refresher.current().policy.max_age.region_state == 7.0
        assert await ConfigStore(store).head() is None
        # Signed or not, nothing from the store is adopted.
        bundle = with_endpoint(read_bundle(sources), ATTACKER_HOST)
        await ConfigStore(store).publish(bundle, 0, "ops", 2_000.0, "publish", OPS_1.sign(bundle.digest, 2_000.0))
        await reloader.sync()
        assert endpoint(deps) == EU_NORTH and rejected(reloader)["unknown_key"] == 1
    finally:
        await reloader.stop()
