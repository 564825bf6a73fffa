"""A key list that would lock everyone out is refused: an empty one (every call would be
UNAUTHENTICATED), or one without an admin key while the keys in use have one (nobody could
reload the config or use RouterAdmin again), from a reloaded file as from the store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from scheduler.config.loader import ConfigError
from scheduler.server.auth import KeyRing, NewKey, create_key
from scheduler.server.config_reload.sources import load_local
from scheduler.server.keys_reload import KeysReloader
from scheduler.state.memory_store import MemoryStore
from tests.unit.server.test_config_reload import make_config, router

ADMIN = create_key("ops", admin=True)
TENANT = create_key("acme")


def keys_text(*keys: NewKey) -> str:
    return yaml.safe_dump({"keys": [k.entry_dict() for k in keys]})


async def test_a_reloaded_keys_file_with_an_empty_list_or_no_admin_left_is_refused(tmp_path: Path) -> None:
    sources = make_config(tmp_path, keys=True)
    assert sources.keys is not None
    sources.keys.write_text(keys_text(ADMIN, TENANT))
    deps, reloader = router(sources, MemoryStore())
    await reloader.start()
    try:
        for text, message in ((keys_text(), "the list is empty"), (keys_text(TENANT), "no key has role admin")):
            sources.keys.write_text(text)
            outcome = await reloader.reload("file-change", only_if_changed=True)
            assert not outcome.ok and not outcome.changed
            (problem,) = outcome.problems
            assert (problem.file, problem.field) == (str(sources.keys), "keys") and message in problem.message
            assert deps.keys is not None and deps.keys.authenticate(f"Bearer {ADMIN.key}").admin
        # Another admin key in place of the first one is fine.
        other = create_key("ops2", admin=True)
        sources.keys.write_text(keys_text(other, TENANT))
        assert (await reloader.reload("file-change", only_if_changed=True)).changed
        assert deps.keys is not None and deps.keys.authenticate(f"Bearer {other.key}").admin
    finally:
        await reloader.stop()


def test_at_start_an_empty_list_is_refused_and_a_ring_without_admin_allowed(tmp_path: Path) -> None:
    sources = make_config(tmp_path, keys=True)
    assert sources.keys is not None
    sources.keys.write_text("keys: []\n")
    with pytest.raises(ConfigError, match="keys: the list is empty: every call would be refused"):
        load_local(sources)
    sources.keys.write_text(keys_text(TENANT))
    loaded = load_local(sources)
    assert loaded.keys is not None and not loaded.keys.has_admin


def test_the_embedded_keys_reloader_refuses_them_too(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.yaml"
    keys_file.write_text(keys_text(ADMIN))
    applied: list[KeyRing] = []
    reloader = KeysReloader(keys_file, applied.append, current=KeyRing.load(keys_file))
    keys_file.write_text("keys: []\n")
    assert not reloader.reload() and not applied
    keys_file.write_text(keys_text(TENANT))
    assert not reloader.reload() and not applied
    keys_file.write_text(keys_text(ADMIN, TENANT))
    assert reloader.reload() and len(applied[0].entries) == 2 and reloader.failures == 2
