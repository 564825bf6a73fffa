"""`scheduler route --explain --json` on the shipped fleet and carbon data: the issue's checks."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.config.loader import load_fleet
from scheduler.datalayer.carbon_csv import SHIPPED_CARBON_DIR, load_zone, zone_file

AT = "2026-06-01T12:00Z"


def route(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main(["route", "--explain", "--json", "--at", AT, *args])
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == (0 if out["schedulable"] else 3)
    return out


def test_long_prompt_goes_to_an_h200_pool(capsys) -> None:  # type: ignore[no-untyped-def]
    out = route(capsys, "--prompt-tokens", "100000")
    assert out["chosen"]["gpu"] == "H200-141GB"
    assert all(c["gpu"] == "H200-141GB" for c in out["candidates"])


def test_eu_request_stays_in_the_eu_and_every_other_region_is_rejected_by_residency(capsys) -> None:  # type: ignore[no-untyped-def]
    out = route(capsys, "--jurisdiction", "EU", "--client-location", "48.85,2.35")
    regions = {r.name: r for r in load_fleet().regions}
    assert regions[out["chosen"]["region"]].jurisdiction == "EU"
    assert all(regions[c["region"]].jurisdiction == "EU" for c in out["candidates"])
    non_eu = {name for name, r in regions.items() if r.jurisdiction != "EU"}
    by_residency = {r["region"] for r in out["rejected"] if r["plugin"] == "residency-filter"}
    assert by_residency == non_eu
    assert all(r["reason"].startswith("jurisdiction ") for r in out["rejected"] if r["plugin"] == "residency-filter")


def test_stale_carbon_lists_the_fallback_and_ranks_like_latency_first(capsys) -> None:  # type: ignore[no-untyped-def]
    request = ["--client-location", "40.71,-74.0", "--prompt-tokens", "2000", "--max-tokens", "300"]
    fresh = route(capsys, *request)
    stale = route(capsys, *request, "--carbon-age", "10800")  # 3 h > the default policy's 2 h
    latency_first = route(capsys, *request, "--policy", "latency-first")
    carbon = [f for f in stale["fallbacks"] if f["signal"] == "carbon"]
    # Every zone's feed stopped: no survivor has a usable signal, the scorer abstains for the
    # whole decision (no bound) and the performance order ranks.
    assert carbon == [{"signal": "carbon", "scorer": "carbon-scorer", "age_s": 10800.0, "max_age_s": 7200.0,
                       "detail": carbon[0]["detail"], "key": carbon[0]["key"], "bound": None, "bound_unit": "",
                       "candidates": []}]
    assert not stale["energy_ranking"]

    def ranking(out: dict[str, Any]) -> list[tuple[str, str]]:
        return [(c["region"], c["pool"]) for c in out["candidates"]]

    assert ranking(stale) == ranking(latency_first)
    assert ranking(fresh) != ranking(stale), "fresh carbon data should change the order for this request"


def stale_copy(tmp_path: Path, zone: str, ends: str) -> Path:
    """The shipped carbon folder with ``zone``'s rows after ``ends`` (a UTC hour of the file's
    year, "2023-06-01 09") dropped: its feed stopped then."""
    folder = tmp_path / "carbon"
    folder.mkdir()
    for source in SHIPPED_CARBON_DIR.glob("*.csv"):
        lines = source.read_text(encoding="utf-8").splitlines()
        if source.name.startswith(f"{zone}_"):
            lines = [line for line in lines if not (line[:4].isdigit() and line[:13] > ends)]
        (folder / source.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def test_one_stale_zone_is_priced_at_its_bound_and_the_rest_still_rank_by_carbon(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """JP-TK's data ends 3 h before T: a Paris client's choice is the one it gets with every zone
    fresh, the fallback names the zone, and its candidates carry the bound."""
    at = "2023-06-01T12:00Z"
    stale_dir = stale_copy(tmp_path, "JP-TK", "2023-06-01 09")
    request = ["--at", at, "--client-location", "48.85,2.35"]
    fresh = route(capsys, *request)
    stale = route(capsys, *request, "--carbon-dir", str(stale_dir))
    assert stale["energy_ranking"]
    assert stale["chosen"] == fresh["chosen"]
    (fallback,) = [f for f in stale["fallbacks"] if f["signal"] == "carbon"]
    assert fallback["key"] == "JP-TK" and fallback["age_s"] == pytest.approx(3 * 3600, abs=1)
    japan = {r.name for r in load_fleet().regions if r.grid_zone == "JP-TK"}
    assert {c.split("/")[0] for c in fallback["candidates"]} == japan
    # The bound: the zone's highest accepted value in the policy's trailing week, at or above
    # the stale value it replaces.
    highest = load_zone(zone_file(stale_dir, "JP-TK"), "JP-TK").highest(datetime(2023, 6, 1, 12, tzinfo=UTC).timestamp(),
                                                                         7 * 86400)
    assert fallback["bound"] == highest and fallback["bound_unit"] == "gCO2e/kWh"
    for candidate in stale["candidates"]:
        bounds = candidate["bounds"]
        if candidate["region"] in japan:
            assert [(b["key"], b["bound"]) for b in bounds] == [("JP-TK", highest)]
        else:
            assert bounds == []
    # Every other candidate keeps its order; the Japanese ones only move down.
    others = [(c["region"], c["pool"]) for c in stale["candidates"] if c["region"] not in japan]
    assert others == [(c["region"], c["pool"]) for c in fresh["candidates"] if c["region"] not in japan]


def test_unschedulable_exit_code_and_table(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["route", "--explain", "--at", AT, "--jurisdiction", "CH"]) == 3
    out = capsys.readouterr().out
    assert "chosen   none" in out and "residency-filter" in out


def test_bad_flags_are_usage_errors(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main(["route", "--client-location", "north"])
    assert exit_info.value.code == 2
    assert "expected LAT,LON" in capsys.readouterr().err
