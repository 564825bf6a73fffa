"""`scheduler route --explain --json` on the shipped fleet and carbon data: the issue's checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from scheduler.cli import main
from scheduler.config.loader import load_fleet

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
    assert carbon == [{"signal": "carbon", "scorer": "carbon-scorer", "age_s": 10800.0, "max_age_s": 7200.0,
                       "detail": carbon[0]["detail"]}]
    assert not stale["energy_ranking"]

    def ranking(out: dict[str, Any]) -> list[tuple[str, str]]:
        return [(c["region"], c["pool"]) for c in out["candidates"]]

    assert ranking(stale) == ranking(latency_first)
    assert ranking(fresh) != ranking(stale), "fresh carbon data should change the order for this request"


def test_unschedulable_exit_code_and_table(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["route", "--explain", "--at", AT, "--jurisdiction", "CH"]) == 3
    out = capsys.readouterr().out
    assert "chosen   none" in out and "residency-filter" in out


def test_bad_flags_are_usage_errors(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        main(["route", "--client-location", "north"])
    assert exit_info.value.code == 2
    assert "expected LAT,LON" in capsys.readouterr().err
