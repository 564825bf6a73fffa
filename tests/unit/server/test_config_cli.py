"""``scheduler config keygen | sign`` and where a router finds its state store URL
(``scheduler.state.url``): the private key and the Redis password stay off command lines."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.server.config_reload.sources import ConfigSources, read_bundle
from scheduler.server.config_signing import BundleSignature, ConfigTrust
from scheduler.state.url import StateUrlError, redacted, resolve_state_url
from tests.unit.server.test_config_reload import edit, make_config

PASSWORD = "s3cret-pw"


def test_keygen_writes_a_private_key_once_and_the_public_half_to_the_trust_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    key, trust = tmp_path / "ops-1.key", tmp_path / "trust.yaml"
    assert main(["config", "keygen", "--kid", "ops-1", "--out", str(key), "--trust", str(trust)]) == 0
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert main(["config", "keygen", "--kid", "ops-2", "--out", str(tmp_path / "ops-2.key"), "--trust",
                 str(trust)]) == 0
    assert set(ConfigTrust.load(trust).keys) == {"ops-1", "ops-2"}
    private = key.read_text()
    assert private.split("private_key: ")[1].strip() not in capsys.readouterr().out  # never printed
    # Never overwritten, never a duplicate key id.
    assert main(["config", "keygen", "--kid", "ops-3", "--out", str(key)]) == 1
    assert key.read_text() == private
    assert main(["config", "keygen", "--kid", "ops-1", "--out", str(tmp_path / "again.key"), "--trust",
                 str(trust)]) == 1
    assert "keys.ops-1: already there" in capsys.readouterr().err
    assert not (tmp_path / "again.key").exists()


def test_sign_writes_a_signature_the_routers_verify_and_refuses_bad_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    key, trust = tmp_path / "ops.key", tmp_path / "trust.yaml"
    assert main(["config", "keygen", "--kid", "ops-1", "--out", str(key), "--trust", str(trust)]) == 0
    sources = make_config(tmp_path / "config", keys=True)
    files = ["--regions", str(sources.regions_dir), "--policies", str(sources.policies_dir), "--keys", str(sources.keys)]
    signature = tmp_path / "config.sig"
    monkeypatch.delenv("SCHEDULER_CONFIG_SIGNING_KEY", raising=False)
    monkeypatch.delenv("SCHEDULER_CONFIG_SIGNING_KEY_FILE", raising=False)
    assert main(["config", "sign", *files, "--out", str(signature)]) == 2
    assert "no signing key" in capsys.readouterr().err and not signature.exists()

    monkeypatch.setenv("SCHEDULER_CONFIG_SIGNING_KEY_FILE", str(key))
    assert main(["config", "sign", *files, "--out", str(signature)]) == 0
    signed = BundleSignature.load(signature)
    digest = read_bundle(ConfigSources(sources.regions_dir, sources.policies_dir, "default", sources.keys)).digest
    ConfigTrust.load(trust).check(digest, signed)

    edit(sources.policies_dir / "default.yaml", "region_state: 5s", "region_state: soon")
    signature.unlink()
    assert main(["config", "sign", *files, "--out", str(signature)]) == 1
    err = capsys.readouterr().err
    assert "max_age.region_state" in err and "not signed" in err and not signature.exists()


def test_the_state_url_comes_from_the_flag_the_file_or_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"redis://router:{PASSWORD}@redis.example:6379/0"
    monkeypatch.delenv("SCHEDULER_STATE", raising=False)
    assert resolve_state_url(None, None, "memory").url == "memory"
    monkeypatch.setenv("SCHEDULER_STATE", url)
    found = resolve_state_url(None, None, "memory")
    assert (found.url, found.source) == (url, "$SCHEDULER_STATE") and found.has_password
    assert PASSWORD not in found.shown and found.shown == "redis://router:***@redis.example:6379/0"
    secret = tmp_path / "url"
    secret.write_text(url.replace("router:", "other:") + "\n")  # a Secret's file may end in a newline
    assert resolve_state_url(None, secret, "memory").url == url.replace("router:", "other:")
    assert resolve_state_url("redis://127.0.0.1:6379/0", None, "memory").source == "--state"
    with pytest.raises(StateUrlError, match="give one"):
        resolve_state_url("memory", secret, "memory")
    with pytest.raises(StateUrlError, match=r"--state-file .*missing: cannot read"):
        resolve_state_url(None, tmp_path / "missing", "memory")
    secret.write_text("")
    with pytest.raises(StateUrlError, match="expected one line"):
        resolve_state_url(None, secret, "memory")
    assert redacted("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


def test_the_router_warns_when_its_arguments_hold_a_password(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    # The config folder does not exist: the router stops after reading its arguments.
    with caplog.at_level(logging.WARNING, logger="scheduler.server.cli"):
        code = main(["router", "--state", f"redis://:{PASSWORD}@127.0.0.1:1/0", "--regions", str(tmp_path / "none"),
                     "--insecure", "--insecure-no-tickets"])
    assert code == exit_codes.CONFIG
    warnings = [r.getMessage() for r in caplog.records if "--state holds a password" in r.getMessage()]
    assert warnings and PASSWORD not in " ".join(warnings) + capsys.readouterr().err
    caplog.clear()
    secret = tmp_path / "url"
    secret.write_text(f"redis://:{PASSWORD}@127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="scheduler.server.cli"):
        assert main(["router", "--state-file", str(secret), "--regions", str(tmp_path / "none"), "--insecure",
                     "--insecure-no-tickets"]) == exit_codes.CONFIG
    assert not [r for r in caplog.records if "password" in r.getMessage()]
