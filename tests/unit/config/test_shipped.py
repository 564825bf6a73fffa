"""The example regions and policies ship inside the package: which folder a command reads,
what it says when that is the shipped one, ``scheduler init``, ``config validate --json``,
``--version`` and the exit codes of the config commands."""

from __future__ import annotations

import filecmp
import io
import json
from argparse import Namespace
from pathlib import Path

import pytest

from scheduler import __version__, exit_codes
from scheduler.cli import main
from scheduler.config.args import resolve_config_dirs
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS, config_dir
from scheduler.config.starter import write_starter

PROJECT = Path(__file__).resolve().parents[3]


@pytest.mark.timeout(10)
@pytest.mark.parametrize("kind", ["regions", "policies"])
def test_the_packaged_examples_are_the_projects_files(kind: str) -> None:
    """One copy: scheduler/examples/<kind> is a link to the top-level folder operators edit (the
    wheel holds the files it points at). A copy in its place would drift; this says so."""
    packaged = {"regions": EMBEDDED_REGIONS, "policies": EMBEDDED_POLICIES}[kind]
    assert packaged.is_symlink() and packaged.resolve() == (PROJECT / kind).resolve()
    names = sorted(p.name for p in (PROJECT / kind).glob("*.yaml"))
    assert names and names == sorted(p.name for p in packaged.glob("*.yaml"))
    _, mismatch, errors = filecmp.cmpfiles(PROJECT / kind, packaged, names, shallow=False)
    assert mismatch == errors == []


@pytest.mark.timeout(10)
@pytest.mark.parametrize(("given", "local", "expected"), [
    ("mine", True, "mine"),          # --regions wins over ./regions
    (None, True, "cwd"),             # a checkout, or a folder `scheduler init` made
    (None, False, "shipped"),        # an installed wheel run anywhere else
], ids=["given", "cwd", "shipped"])
def test_which_folder_a_command_reads(tmp_path: Path, given: str | None, local: bool, expected: str) -> None:
    if local:
        (tmp_path / "regions").mkdir()
    chosen = config_dir("regions", None if given is None else tmp_path / given, tmp_path)
    assert chosen == {"mine": tmp_path / "mine", "cwd": tmp_path / "regions", "shipped": EMBEDDED_REGIONS}[expected]


@pytest.mark.timeout(10)
def test_the_command_says_when_it_uses_the_shipped_examples(tmp_path: Path) -> None:
    (tmp_path / "policies").mkdir()
    err = io.StringIO()
    args = Namespace(regions=None, policies=None)
    resolve_config_dirs(args, tmp_path, err)
    assert (args.regions, args.policies) == (EMBEDDED_REGIONS, tmp_path / "policies")
    assert "using the example regions shipped with the package" in err.getvalue()
    assert "policies" not in err.getvalue().split("package")[0]  # ./policies was used, not the shipped ones
    quiet = io.StringIO()
    resolve_config_dirs(Namespace(regions=EMBEDDED_REGIONS, policies=tmp_path), tmp_path, quiet)
    assert quiet.getvalue() == ""  # given on the command line: nothing to say
    resolve_config_dirs(Namespace(other=1), tmp_path, quiet)  # a command without config folders
    assert quiet.getvalue() == ""


@pytest.mark.timeout(30)
def test_init_writes_a_config_that_validates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "fleet"
    assert main(["init", str(target)]) == exit_codes.OK
    assert f"scheduler config validate --regions {target}/regions" in capsys.readouterr().out
    assert sorted(p.name for p in (target / "regions").iterdir()) == sorted(p.name for p in EMBEDDED_REGIONS.glob("*.yaml"))
    assert "scheduler config validate" in (target / "README.md").read_text()
    assert main(["config", "validate", "--regions", str(target / "regions"),
                 "--policies", str(target / "policies")]) == exit_codes.OK
    assert "ok: 8 regions" in capsys.readouterr().out


@pytest.mark.timeout(10)
def test_init_never_overwrites(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "mine.yaml").write_text("name: mine\n")
    with pytest.raises(FileExistsError, match="policies"):
        write_starter(tmp_path)
    assert not (tmp_path / "regions").exists()  # nothing half-written
    assert main(["init", str(tmp_path)]) == exit_codes.FAILURE
    assert "only writes new files" in capsys.readouterr().err
    assert (tmp_path / "policies" / "mine.yaml").read_text() == "name: mine\n"


@pytest.mark.timeout(30)
def test_validate_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_starter(tmp_path)
    dirs = ["--regions", str(tmp_path / "regions"), "--policies", str(tmp_path / "policies")]
    assert main(["config", "validate", "--json", *dirs]) == exit_codes.OK
    ok = json.loads(capsys.readouterr().out)
    assert ok["ok"] is True and ok["issues"] == []
    assert "eu-north" in ok["regions"] and "default" in ok["policies"] and ok["gpus"] > 0
    broken = tmp_path / "regions" / "eu-north.yaml"
    broken.write_text(broken.read_text().replace("pue: 1.1", "pue: high", 1))
    assert main(["config", "validate", "--json", *dirs]) == exit_codes.CONFIG
    out, err = capsys.readouterr()
    failed = json.loads(out)  # stdout stays one JSON object when the files are bad
    assert failed["ok"] is False and failed["regions"] == [] and err == ""
    assert [(i["file"], i["field"]) for i in failed["issues"]] == [(str(broken), "pue")]
    assert "'high'" in failed["issues"][0]["message"]


@pytest.mark.timeout(10)
def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == exit_codes.OK
    assert capsys.readouterr().out.strip() == f"scheduler {__version__}"


@pytest.mark.timeout(30)
def test_config_error_usage_error_and_unschedulable_differ(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["route", "--regions", str(tmp_path / "none")]) == exit_codes.CONFIG
    assert main(["route", "--policy", "greenest"]) == exit_codes.CONFIG
    with pytest.raises(SystemExit) as usage:
        main(["route", "--prompt-tokens", "-3"])
    assert usage.value.code == exit_codes.USAGE
    assert main(["route", "--jurisdiction", "CH", "--at", "2026-06-01T12:00Z"]) == exit_codes.UNSCHEDULABLE
    assert len({exit_codes.OK, exit_codes.FAILURE, exit_codes.USAGE, exit_codes.UNSCHEDULABLE, exit_codes.CONFIG}) == 5
