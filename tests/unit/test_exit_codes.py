"""docs/cli.md's table of exit codes is the one in ``scheduler.exit_codes``: no code added,
renumbered or dropped in one place only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler import exit_codes

CLI_DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


@pytest.mark.timeout(10)
def test_the_documented_exit_codes_are_the_modules() -> None:
    section = CLI_DOC.read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| ([^|:]+)", section, re.MULTILINE)}
    defined = {value: name for name, value in vars(exit_codes).items() if name.isupper() and isinstance(value, int)}
    assert sorted(documented) == sorted(defined), (documented, defined)
    # Each row's meaning starts with its constant's name: "usage error" for USAGE, "config error" for CONFIG.
    for code, name in defined.items():
        assert documented[code].lower().startswith(name.lower().split("_")[0][:5]), (code, name, documented[code])
