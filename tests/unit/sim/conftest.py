"""The ``files`` fixture: carbon CSVs and a trace in a temporary folder (see kit.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.sim.kit import Files, make_files


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return make_files(tmp_path)
