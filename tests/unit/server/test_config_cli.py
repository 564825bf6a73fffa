"""Where a router finds its state store URL (``scheduler.state.url``): the Redis password
stays off its command line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.state.url import StateUrlError, redacted, resolve_state_url

PASSWORD = "s3cret-pw"


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
    assert code == 1
    warnings = [r.getMessage() for r in caplog.records if "--state holds a password" in r.getMessage()]
    assert warnings and PASSWORD not in " ".join(warnings) + capsys.readouterr().err
    caplog.clear()
    secret = tmp_path / "url"
    secret.write_text(f"redis://:{PASSWORD}@127.0.0.1:1/0")
    with caplog.at_level(logging.WARNING, logger="scheduler.server.cli"):
        assert main(["router", "--state-file", str(secret), "--regions", str(tmp_path / "none"), "--insecure",
                     "--insecure-no-tickets"]) == 1
    assert not [r for r in caplog.records if "password" in r.getMessage()]
