"""``scheduler simulate`` end to end on the shipped fleet, a few simulated minutes long."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from scheduler import exit_codes
from scheduler.cli import main
from scheduler.sim.carbon_feed import ProviderOutage
from scheduler.sim.cli import add_scenario_args, spec_from_args


@pytest.mark.timeout(300)
def test_simulate_json_and_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plots = tmp_path / "plots"
    code = main([
        "simulate", "--compare", "default,latency-first", "--trace", "code", "--hours", "0.05", "--rate", "5",
        "--seed", "3", "--json", "--plots", str(plots), "--no-progress",
        "--carbon-outage", "*@0+1h", "--carbon-outage", "DE-LU@2023-06-01T00:01Z+30m",
        "--region-outage", "eu-north@0+10m",
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
    one = datetime(2023, 6, 1, 0, 1, tzinfo=UTC).timestamp()
    assert out["scenario"]["carbon_outages"][1] == {"zone": "DE-LU", "start": one, "end": one + 1800.0}
    assert sorted(path.name for path in plots.iterdir()) == ["grid_intensity.png", "policies.png", "region_share.png"]


@pytest.mark.timeout(300)
def test_simulate_reports_prediction_errors_per_gpu_type_under_either_truth(capsys: pytest.CaptureFixture[str]) -> None:
    # 0.5 % of the shipped fleet at 20 requests/s for 2 minutes: queues, A100 and H200 pools busy.
    shape = ["simulate", "--compare", "default", "--capacity-scale", "0.005", "--rate", "20", "--hours", "0.03",
             "--seed", "1", "--json", "--no-progress"]
    runs = {}
    for truth in ("model-form", "rated"):
        assert main([*shape, "--truth", truth]) == 0
        runs[truth] = json.loads(capsys.readouterr().out)
    model_form, rated = runs["model-form"], runs["rated"]
    assert model_form["scenario"]["truth"]["name"] == "model-form"
    assert model_form["scenario"]["truth"]["kv_knee_factor"] == 1.5
    factors = model_form["scenario"]["truth"]["gpu_energy_factor"]
    assert set(factors) == {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB"}
    assert rated["scenario"]["truth"] == {
        "name": "rated", "pool_sigma": 0.1, "kv_knee_tokens": 4096, "kv_knee_factor": 1.0, "gpu_bias": False,
        "rtt_sigma": 0.0, "rtt_tail_share": 0.0, "rtt_tail_s": 0.2}
    for run in (model_form, rated):
        errors = run["policies"][0]["prediction_error"]
        assert errors["all"]["energy"] == run["policies"][0]["energy_error"]
        by_gpu = errors["by_gpu"]
        assert sum(g["requests"] for g in by_gpu.values()) == errors["all"]["requests"] > 0
        for group in by_gpu.values():
            for kind in ("energy", "ttft"):
                stats = group[kind]
                assert stats["p10_pct"] <= stats["p50_pct"] <= stats["p90_pct"] <= stats["p99_pct"]
    # Under the model-form truth a GPU type's mean energy error follows its drawn bias: the
    # predictor is 1 / factor - 1 off on top of what the batch and queue do.
    gpu, factor = max(factors.items(), key=lambda item: abs(item[1] - 1.0))
    rated_mean = rated["policies"][0]["prediction_error"]["by_gpu"][gpu]["energy"]["mean_pct"]
    model_mean = model_form["policies"][0]["prediction_error"]["by_gpu"][gpu]["energy"]["mean_pct"]
    assert (model_mean - rated_mean) * (1.0 - factor) > 0


def test_simulate_rejects_an_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--compare", "greenest", "--hours", "0.01", "--no-progress"]) == exit_codes.CONFIG
    assert "no policy named 'greenest'" in capsys.readouterr().err


def test_simulate_rejects_a_bad_outage_window() -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--region-outage", "eu-north@soon", "--no-progress"])
    with pytest.raises(SystemExit):
        main(["simulate", "--carbon-outage", "DE-LU@2023-06-01T06:00Z", "--no-progress"])


@pytest.mark.parametrize("window", ["DE-LU@2023-06-01T06:00Z+6h", "DE-LU@2023-06-01T08:00+02:00+6h",
                                    "DE-LU@+6h+6h", "DE-LU@6h+360m", "DE-LU@21600+6h"])
def test_a_carbon_outage_starts_at_an_iso_time_or_an_offset(window: str) -> None:
    parser = argparse.ArgumentParser()
    add_scenario_args(parser, hours=24.0, rate=None)
    spec = spec_from_args(parser.parse_args(["--carbon-outage", window, "--carbon-outage", "*@+1h+30m"]))
    six = datetime(2023, 6, 1, 6, tzinfo=UTC).timestamp()
    assert spec.carbon_outages == (ProviderOutage("DE-LU", six, six + 6 * 3600.0),
                                   ProviderOutage(None, six - 5 * 3600.0, six - 4.5 * 3600.0))


def test_sim_vs_real_rejects_a_bad_request_count_before_starting_an_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-vs-real", "--requests", "0"]) == 1
    assert "--requests must be between 1 and" in capsys.readouterr().err


def test_simulate_rejects_a_negative_truth_error() -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--truth-error", "-0.1", "--no-progress"])


def test_sim_vs_real_rejects_region_options_on_the_engine_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "sim-vs-real", "--through", "engine", "--endpoint", "http://127.0.0.1:1/x"]) == 1
    assert "--endpoint and --model apply to --through region" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_simulate_deferral_prints_the_deferrable_works_figures(capsys: pytest.CaptureFixture[str]) -> None:
    # The command shape, a few simulated minutes long.
    code = main([
        "simulate", "--trace", "conv", "--hours", "0.05", "--rate", "5", "--deferrable-share", "0.3",
        "--deferrable-deadline", "6h", "--json", "--no-progress", "--compare", "default,latency-first",
    ])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["scenario"]["deferrable_deadline_s"] == 6 * 3600
    assert out["scenario"]["deferral"]["forecast_error"] == 0.15
    for p in out["policies"]:
        assert p["deferral"] == "queue"
        assert 200 < p["deferrable_requests"] < 350
        for key in ("deferred_gco2e_per_request", "deferred_gco2e_per_request_at_arrival", "missed_deadlines"):
            assert key in p, key
        assert p["missed_deadlines"] == 0
        assert sum(p["deferred_release_reasons"].values()) == p["deferrable_requests"]
        assert p["ran"] == p["requests"] == 900


def test_simulate_without_deferrable_requests_prints_no_deferral_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--trace", "code", "--hours", "0.01", "--rate", "2", "--json", "--no-progress",
                 "--compare", "default"]) == 0
    (policy,) = json.loads(capsys.readouterr().out)["policies"]
    assert not any(key.startswith("deferred") or key == "missed_deadlines" for key in policy)


def test_simulate_rejects_a_zero_deadline() -> None:
    with pytest.raises(SystemExit):
        main(["simulate", "--deferrable-deadline", "0", "--no-progress"])


@pytest.mark.timeout(300)
def test_simulate_reports_the_whole_fleet_and_the_gap_to_the_hindsight_bound(capsys: pytest.CaptureFixture[str]) -> None:
    shape = ["simulate", "--compare", "default,latency-first", "--trace", "code", "--hours", "0.05", "--rate", "5",
             "--seed", "3", "--json", "--no-progress", "--oracle"]
    runs = {}
    for mode in ("autoscaled", "fixed"):
        assert main([*shape, *(["--fixed-sizes"] if mode == "fixed" else [])]) == 0
        runs[mode] = json.loads(capsys.readouterr().out)
    autoscaled, fixed = runs["autoscaled"], runs["fixed"]
    # autoscaled on each pool's own settings (region file, else the default): nothing overridden
    assert set(autoscaled["scenario"]["autoscaling"].values()) == {None}
    assert fixed["scenario"]["autoscaling"] is None
    for run in (autoscaled, fixed):
        bound = run["oracle"]["fleet_gco2e_per_request"]
        assert bound > 0
        for p in run["policies"]:
            assert p["gap_to_oracle"] == pytest.approx(p["fleet_gco2e_per_request"] / bound - 1.0)
            # the fleet pays the requests' grams and more (idle replicas)
            assert p["fleet_gco2e_per_request"] > p["gco2e_per_request"]
            assert sum(r["gco2e"] for r in p["fleet_by_region"].values()) == pytest.approx(
                p["fleet_gco2e_per_request"] * p["ran"])
            assert sum(r["kwh"] for r in p["fleet_by_pool"].values()) == pytest.approx(p["fleet_kwh"])
    # ~2,000 GPUs idle for 3 minutes with fixed sizes; one replica a pool, and those woken, autoscaled
    for auto, fix in zip(autoscaled["policies"], fixed["policies"], strict=True):
        assert fix["cold_starts"] == 0
        assert auto["fleet_kwh"] < fix["fleet_kwh"] / 10
