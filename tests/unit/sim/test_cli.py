"""``scheduler simulate`` end to end on the shipped fleet, a few simulated minutes long."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scheduler.cli import main


@pytest.mark.timeout(300)
def test_simulate_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plots = tmp_path / "plots"
    code = main([
        "simulate", "--compare", "default,latency-first", "--trace", "code", "--hours", "0.05", "--rate", "5",
        "--seed", "3", "--json", "--plots", str(plots), "--no-progress",
        "--carbon-outage", "*@0+1h", "--region-outage", "eu-north@0+10m",
    ])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert [p["policy"] for p in out["policies"]] == ["default", "latency-first"]
    for p in out["policies"]:
        assert p["requests"] == 900
        assert p["violations"] == 0
        assert p["region_share"]["eu-north"] == 0.0
        assert sum(p["region_share"].values()) == pytest.approx(1.0)
    assert out["scenario"]["carbon_outages"][0]["zone"] is None
    assert sorted(path.name for path in plots.iterdir()) == ["grid_intensity.png", "policies.png", "region_share.png"]


def test_simulate_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--compare", "greenest", "--hours", "0.01", "--no-progress"]) == 1
    assert "no policy named 'greenest'" in capsys.readouterr().err


def test_simulate_rejects_a_bad_outage_window() -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--region-outage", "eu-north@soon", "--no-progress"])


def test_sim_vs_real_rejects_a_bad_request_count_before_starting_an_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-vs-real", "--requests", "0"]) == 1
    assert "--requests must be between 1 and" in capsys.readouterr().err


def test_simulate_rejects_a_negative_truth_error() -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--truth-error", "-0.1", "--no-progress"])


def test_sim_vs_real_rejects_region_options_on_the_engine_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-vs-real", "--through", "engine", "--endpoint", "http://127.0.0.1:1/x"]) == 1
    assert "--endpoint and --model apply to --through region" in capsys.readouterr().err
