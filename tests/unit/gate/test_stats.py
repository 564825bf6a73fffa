"""A bucket's J/token and its interval from receipts (scheduler.gate.stats, the module's formula)."""

from __future__ import annotations

import math

import pytest

from scheduler.gate.stats import Sample, stable, summarise, t975


def sample(energy: float, low: float, high: float, tokens: int = 100, source: str = "nvml",
           place: str = "eu-north/h200-long", version: str = "") -> Sample:
    return Sample(energy_j=energy, energy_j_low=low, energy_j_high=high, completion_tokens=tokens, prompt_tokens=50,
                  measurement_source=source, attribution_method="predicted-share-v1", place=place,
                  config_version=version)


@pytest.mark.timeout(30)
def test_the_interval_is_the_mean_receipt_bounds_widened_by_the_spread() -> None:
    samples = [sample(10.0, 8.0, 12.0), sample(12.0, 9.0, 15.0, version="v2"), sample(14.0, 12.0, 16.0, source="model")]
    s = summarise(samples)
    x = [0.10, 0.12, 0.14]
    sd = math.sqrt(sum((v - 0.12) ** 2 for v in x) / 2)
    spread = 4.303 * sd / math.sqrt(3)
    assert s.n == 3 and s.completion_tokens == 300
    assert s.mean_j_per_token == pytest.approx(0.12)
    assert s.sd_j_per_token == pytest.approx(sd) and s.spread_j_per_token == pytest.approx(spread)
    assert s.receipt_low_j_per_token == pytest.approx((0.08 + 0.09 + 0.12) / 3)
    assert s.receipt_high_j_per_token == pytest.approx((0.12 + 0.15 + 0.16) / 3)
    assert s.low_j_per_token == pytest.approx(max(0.0, (0.08 + 0.09 + 0.12) / 3 - spread))
    assert s.high_j_per_token == pytest.approx((0.12 + 0.15 + 0.16) / 3 + spread)
    assert s.sources == {"nvml": 2, "model": 1} and s.config_versions == ["v2"]
    assert s.places == {"eu-north/h200-long": 3}


@pytest.mark.timeout(30)
def test_per_token_means_per_output_token_of_each_sample() -> None:
    s = summarise([sample(10.0, 10.0, 10.0, tokens=10), sample(10.0, 10.0, 10.0, tokens=100)])
    assert s.mean_j_per_token == pytest.approx((1.0 + 0.1) / 2)


@pytest.mark.timeout(30)
def test_one_sample_has_no_interval_and_is_not_stable() -> None:
    s = summarise([sample(10.0, 9.0, 11.0)])
    assert s.mean_j_per_token == pytest.approx(0.1) and s.low_j_per_token is None and s.high_j_per_token is None
    assert not stable(s, 0.5)
    assert summarise([]).mean_j_per_token is None


@pytest.mark.timeout(30)
def test_stable_when_the_spread_is_within_the_target() -> None:
    tight = summarise([sample(10.0 + i * 0.01, 9.0, 11.0) for i in range(10)])
    loose = summarise([sample(5.0 + i, 4.0, 16.0) for i in range(10)])
    assert stable(tight, 0.05) and not stable(loose, 0.05)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("df", "t"), [(1, 12.706), (4, 2.776), (30, 2.042), (40, 2.021), (120, 1.980), (10_000, 1.960)])
def test_t_quantile(df: int, t: float) -> None:
    assert t975(df) == pytest.approx(t, abs=0.003)
