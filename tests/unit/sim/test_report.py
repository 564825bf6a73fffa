"""The prediction-error figures of the report (scheduler.sim.report), on numbers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scheduler.sim.report import prediction_errors, relative_errors


def test_relative_errors_are_signed_percent_of_the_measured_value() -> None:
    measured = np.array([100.0, 100.0, 100.0, 100.0, 50.0])
    predicted = np.array([90.0, 100.0, 110.0, 130.0, math.nan])  # the NaN is left out
    out = relative_errors(predicted, measured)
    assert out["requests"] == 4
    assert out["mean_pct"] == pytest.approx(7.5)
    assert out["mean_abs_pct"] == pytest.approx(12.5)
    assert out["p50_pct"] == pytest.approx(5.0)
    assert out["p10_pct"] == pytest.approx(-7.0)  # numpy's linear interpolation between -10 and 0
    assert out["p99_pct"] == pytest.approx(29.4)
    assert math.isnan(relative_errors(np.array([1.0]), np.array([0.0]))["mean_pct"])


def test_prediction_errors_group_by_gpu_type_and_context_band() -> None:
    measured = np.array([100.0, 100.0, 100.0, 100.0])
    predicted = np.array([80.0, 120.0, 100.0, 50.0])
    ttft = np.array([0.1, 0.1, 0.2, 0.2])
    gpu = np.array(["H100-80GB", "H100-80GB", "H200-141GB", "H200-141GB"], dtype=object)
    context = np.array([500, 5000, 1023, 9000])
    out = prediction_errors(predicted, measured, ttft * 1.5, ttft, gpu, context)
    assert out["all"]["requests"] == 4 and out["all"]["energy"]["mean_pct"] == pytest.approx(-12.5)
    assert out["by_gpu"]["H100-80GB"]["energy"]["mean_pct"] == pytest.approx(0.0)
    assert out["by_gpu"]["H100-80GB"]["energy"]["mean_abs_pct"] == pytest.approx(20.0)
    assert out["by_gpu"]["H200-141GB"]["energy"]["mean_pct"] == pytest.approx(-25.0)
    assert {band: g["requests"] for band, g in out["by_context"].items()} == {"<1k": 2, "4k-8k": 1, ">=8k": 1}
    assert out["by_context"][">=8k"]["energy"]["p50_pct"] == pytest.approx(-50.0)
    assert out["all"]["ttft"]["p90_pct"] == pytest.approx(50.0)
