"""`scheduler route --explain` on a fleet with a plain vLLM region (kind ``vllm``): the table and
the JSON say that the region checks no dispatch ticket and that its energy is modelled."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from scheduler.cli import main
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS

pytestmark = pytest.mark.timeout(60)

AT = "2026-06-01T12:00Z"
# eu-north (the cleanest grid of the shipped fleet, chosen for an EU request) as plain vLLM servers.
VLLM_POOLS = """
kind: vllm
pools:
  - name: h200-long
    gpu: H200-141GB
    count: 8
    models:
      - {name: llama-3.1-8b, max_context: 131072}
    vllm: {urls: ["http://10.0.0.5:8000"]}
"""


@pytest.fixture
def fleet_dirs(tmp_path: Path) -> tuple[Path, Path]:
    regions = tmp_path / "regions"
    shutil.copytree(EMBEDDED_REGIONS, regions)
    text = (regions / "eu-north.yaml").read_text()
    # Everything up to its pools, then the plain vLLM pools (no local profile: `scheduler up` is Ray's).
    (regions / "eu-north.yaml").write_text(text[: text.index("pools:")].replace(
        "endpoint: http://127.0.0.1:8000/eu-north\n", "") + VLLM_POOLS)
    return regions, EMBEDDED_POLICIES


def route(fleet_dirs: tuple[Path, Path], *args: str) -> int:
    regions, policies = fleet_dirs
    return main(["route", "--explain", "--at", AT, "--regions", str(regions), "--policies", str(policies),
                 "--jurisdiction", "EU", *args])


def test_the_table_says_tickets_are_not_enforced_and_energy_is_modelled(
        fleet_dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert route(fleet_dirs) == 0
    out = capsys.readouterr().out
    assert out.startswith("chosen   eu-north / h200-long")
    plain = [line for line in out.splitlines() if line.startswith("plain vLLM")]
    assert plain == ["plain vLLM  eu-north (kind vllm): tickets_enforced false (a dispatch ticket is not checked "
                     "there), energy modelled, not measured"]


def test_the_json_marks_the_region_and_its_candidates(
        fleet_dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert route(fleet_dirs, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    chosen = out["chosen"]
    assert (chosen["region"], chosen["kind"], chosen["tickets_enforced"], chosen["energy_measured"]) == (
        "eu-north", "vllm", False, False)
    enforced = {c["region"]: c["tickets_enforced"] for c in out["candidates"]}
    assert enforced.pop("eu-north") is False
    assert enforced and all(enforced.values())
